"""How a context's title and tags read, whoever writes them — a human (PATCH
/api/v1/images/{id}) or an agent: a title is one line; a tag is trimmed with its whitespace runs
made single spaces and its invisible characters (zero-width space, word joiner, BOM, soft hyphen)
dropped, and a list of tags holds no tag without a visible character and no tag twice ("Cat",
"cat" and the full-width "Ｃａｔ" are one tag, spelled as it came first, in the order given). The limits of
:mod:`app.stages.agent.limits` apply to the values made here (:func:`checked_agent_context` for
an agent's). Pure functions."""

from __future__ import annotations

import json
import math
import numbers
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from app.stages.agent import limits
from app.stages.errors import PermanentError

#: Characters that show nothing and join or split nothing a reader sees: dropped from tags.
#: (Zero-width joiners stay: they make one emoji of several, and shape Indic scripts.)
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u2060\ufeff\u00ad"))
#: Categories of characters that are nothing visible on their own: marks, separators, controls,
#: formats. A tag of only these (a lone combining accent, a zero-width joiner) is empty.
_NOT_ON_THEIR_OWN = ("M", "Z", "Cc", "Cf")


def single_line(text: str) -> str:
    """``text`` trimmed, each run of whitespace (line breaks, tabs, U+3000 included) one space."""
    return " ".join(text.split())


def tag_key(tag: str) -> str:
    """What makes two tags one tag: Unicode compatibility forms (full-width letters, ligatures),
    case and whitespace runs do not count (NFKC, casefold, NFKC again: caseless matching)."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", tag.translate(_INVISIBLE)).casefold())
    return single_line(folded)


def _visible(tag: str) -> bool:
    return any(not unicodedata.category(c).startswith(_NOT_ON_THEIR_OWN) for c in tag)


def normalise_tags(tags: Iterable[str]) -> list[str]:
    """Each tag as :func:`single_line`, its invisible characters dropped; tags without a visible
    character dropped; a tag whose :func:`tag_key` came before dropped (the first spelling is
    kept); the order kept."""
    seen: set[str] = set()
    out: list[str] = []
    for raw in tags:
        tag = single_line(raw.translate(_INVISIBLE))
        key = tag_key(tag)
        if _visible(tag) and key not in seen:
            seen.add(key)
            out.append(tag)
    return out


#: NUL (PostgreSQL stores it in neither text nor jsonb) and UTF-16 surrogates (a JSON "\ud800"
#: escape decodes to one; no UTF-8 encoder takes it): refused in every text field (as the API's).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_TEXT_LIMITS = {"title": limits.TITLE_MAX, "description": limits.DESCRIPTION_MAX, "ocr_text": limits.OCR_TEXT_MAX}
#: Tags an agent may hand over before empty and repeated ones are dropped (as a PATCH may send).
_TAGS_SENT_MAX = 10 * limits.TAGS_MAX


#: Longest provider-chosen name (model, request id) stored as provenance.
NAME_MAX = 200


def storable_name(value: Any) -> str | None:
    """A provider-chosen name (model, completion or request id) fit to store — a string (or an
    integer, as its digits) of at most :data:`NAME_MAX` characters without NUL or unpaired
    surrogates — else None (the caller falls back to its own): a name is provenance, not a
    reason to fail a paid answer."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and 0 < len(value) <= NAME_MAX and not _UNSTORABLE.search(value):
        return value
    return None


def _bad_output(message: str) -> PermanentError:
    return PermanentError(f"the agent's context is not storable: {message}", code="agent_bad_output")


def checked_agent_context(context: Any) -> dict[str, Any]:
    """An agent's context as it is stored, or ``PermanentError(agent_bad_output)``: the context
    any agent hands over (a built-in one, a ``module:Class`` one, or a result adopted after a
    crash) must be what a human may write through PATCH /api/v1/images/{id} — title, description,
    ocr_text strings and tags a list of strings, without NUL or unpaired surrogates, within
    :mod:`app.stages.agent.limits` — with the title one line and the tags normalised as a PATCH
    stores them. ``facts`` (the pixel facts) must be an object if present; other keys are dropped.

    Without it a context of the wrong shape (tags a number) crashed the completion of its whole
    batch, and one past the limits was stored, then refused when the edit form saved it back."""
    if not isinstance(context, Mapping):
        raise _bad_output("it is not an object")
    out: dict[str, Any] = {}
    for key, limit in _TEXT_LIMITS.items():
        value = context.get(key)
        if not isinstance(value, str):
            raise _bad_output(f"{key!r} must be a string")
        if _UNSTORABLE.search(value):
            raise _bad_output(f"{key!r} holds NUL or unpaired surrogates")
        if key == "title":
            value = single_line(value)
        if len(value) > limit:
            raise _bad_output(f"{key!r} is longer than {limit} characters")
        out[key] = value
    tags = context.get("tags")
    if not isinstance(tags, list | tuple) or len(tags) > _TAGS_SENT_MAX:
        raise _bad_output(f"'tags' must be a list of at most {limits.TAGS_MAX} strings")
    if not all(isinstance(t, str) and not _UNSTORABLE.search(t) for t in tags):
        raise _bad_output("'tags' must be strings without NUL or unpaired surrogates")
    out["tags"] = normalise_tags(tags)
    if len(out["tags"]) > limits.TAGS_MAX or any(len(t) > limits.TAG_MAX for t in out["tags"]):
        raise _bad_output(f"'tags' must be at most {limits.TAGS_MAX} tags of at most {limits.TAG_MAX} characters")
    facts = context.get("facts", {})
    if not isinstance(facts, Mapping):
        raise _bad_output("'facts' must be an object")
    out["facts"] = _plain_facts(facts)
    return out


def _plain_facts(facts: Mapping) -> dict[str, Any]:
    """``facts`` as plain JSON data jsonb stores, or ``agent_bad_output``: objects with string keys,
    lists, strings, finite numbers (NumPy's too, as ``int``/``float``), booleans and null; at most
    :data:`limits.FACTS_DEPTH_MAX` deep and :data:`limits.FACTS_MAX_BYTES` as JSON; no NUL or unpaired
    surrogate. A NumPy scalar counts as its Python value. Without it facts nested too deep for any encoder raised out of the worker's
    completion (every claim of its batch left running, a paid one to end ``unknown_execution``),
    NaN was stored as null and a NumPy number as its ``str()``."""
    def plain(value: Any, depth: int) -> Any:
        if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
            value = value.item()  # a NumPy scalar (np.bool_ is no Integral): its Python value
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str):
            if _UNSTORABLE.search(value):
                raise _bad_output("'facts' holds NUL or unpaired surrogates")
            return value
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            if not math.isfinite(value):
                raise _bad_output("'facts' holds NaN or an infinity")
            return float(value)
        if depth > limits.FACTS_DEPTH_MAX and isinstance(value, Mapping | list | tuple):
            raise _bad_output(f"'facts' is nested more than {limits.FACTS_DEPTH_MAX} levels deep")
        if isinstance(value, list | tuple):
            return [plain(v, depth + 1) for v in value]
        if isinstance(value, Mapping):
            if not all(isinstance(k, str) for k in value):
                raise _bad_output("'facts' keys must be strings")
            return {plain(k, depth): plain(v, depth + 1) for k, v in value.items()}
        raise _bad_output(f"'facts' holds a {type(value).__name__}, which is no JSON value")

    out = plain(facts, 1)
    try:
        encoded = json.dumps(out, ensure_ascii=False)
    except ValueError:  # an integer of more digits than Python writes (sys.get_int_max_str_digits)
        raise _bad_output("'facts' holds an integer too long to write as JSON") from None
    if len(encoded.encode("utf-8")) > limits.FACTS_MAX_BYTES:
        raise _bad_output(f"'facts' is larger than {limits.FACTS_MAX_BYTES} bytes as JSON")
    return out
