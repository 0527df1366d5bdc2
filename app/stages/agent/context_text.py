"""How a context's title and tags read, whoever writes them — a human (PATCH
/api/v1/images/{id}) or an agent: a title is one line; a tag is trimmed with its whitespace runs
made single spaces and its invisible characters (zero-width space, word joiner, BOM, soft hyphen)
dropped, and a list of tags holds no tag without a visible character and no tag twice ("Cat",
"cat" and the full-width "Ｃａｔ" are one tag, spelled as it came first, in the order given). The limits of
:mod:`app.stages.agent.limits` apply to the values made here. Pure functions."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

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
