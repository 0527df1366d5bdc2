"""Canonical hashing: metadata hash, semantic document and stage input fingerprints (SPEC §3.2–3.3).

Equal inputs always give equal fingerprints: everything goes through one canonical JSON encoding
(sorted keys, UTF-8, no whitespace) before sha256.
"""

from __future__ import annotations

import functools
import hashlib
import json
import unicodedata
from collections.abc import Mapping
from typing import Any

import orjson

from app.search import slang
from app.search.hanzi import to_simplified

METADATA_SCHEMA_VERSION = 1
# The context keys that make up the metadata hash and the semantic document; provenance and the
# provider's visual facts are excluded (they do not change what the text says).
CONTEXT_TEXT_FIELDS = ("title", "description", "ocr_text", "tags")


# ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)``,
# the definition: its bytes are hashed into fingerprints and dedupe keys and must never change.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
_PLAIN_DEPTH = 32


def _plain(value: Any, depth: int = 0) -> bool:
    """Only str (a subclass too, e.g. a ``StrEnum`` member: both encoders write its characters),
    exact int, bool, None, lists, tuples and dicts with exact str keys: the values on which orjson's
    sorted output is byte for byte ``_CANONICAL``'s (floats, other subclasses and anything
    ``default=str`` converts are not; a str subclass as a key could sort by its own ``<``)."""
    kind = type(value)
    if isinstance(value, str) or kind is int or kind is bool or value is None:
        return True
    if depth >= _PLAIN_DEPTH:
        return False
    if kind is dict:
        return all(type(k) is str and _plain(v, depth + 1) for k, v in value.items())
    if kind is list or kind is tuple:
        return all(_plain(v, depth + 1) for v in value)
    return False


def canonical_json_bytes(value: Any) -> bytes:
    """The canonical JSON of ``value`` as UTF-8. orjson (≈ 10× faster; the fingerprints and dedupe
    keys of every stage transition were ≈ 8 % of a no-op worker's CPU, docs/performance-log.md
    §52) where it gives the same bytes — plain values; an integer beyond 64 bits makes it refuse —
    and the standard library's encoder otherwise."""
    if _plain(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass
    return _CANONICAL.encode(value).encode("utf-8")


def canonical_json(value: Any) -> str:
    """Canonical JSON text: sorted keys, no whitespace, non-ASCII kept, ``str()`` of anything else."""
    if _plain(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        except orjson.JSONEncodeError:
            pass
    return _CANONICAL.encode(value)


def sha256_hex(value: Any) -> str:
    return hashlib.sha256(canonical_json_bytes(value)).hexdigest()


def whitelisted_context(context: Mapping[str, Any] | None) -> dict[str, Any]:
    context = context or {}
    out: dict[str, Any] = {}
    for key in CONTEXT_TEXT_FIELDS:
        value = context.get(key)
        if key == "tags":
            out[key] = [str(t) for t in (value or [])]
        else:
            out[key] = "" if value is None else str(value)
    return out


def metadata_hash(display_name: str | None, context: Mapping[str, Any] | None) -> str:
    """sha256 of {schema_version, display_name, context: whitelisted fields} (provenance excluded)."""
    return sha256_hex(
        {
            "schema_version": METADATA_SCHEMA_VERSION,
            "display_name": display_name or "",
            "context": whitelisted_context(context),
        }
    )


DOCUMENT_VERSIONS = ("1", "2", "3", "4", "5")
DEFAULT_DOCUMENT_VERSION = "5"


def semantic_document(display_name: str | None, context: Mapping[str, Any] | None, version: str = "1") -> str:
    """Deterministic text rendering of the image's text fields for the embedding model.

    Version "1": labelled lines of every field (name, title, description, text, tags).
    Version "2": only what carries meaning, unlabelled — the text in the image, then the title,
    description and tags where they add words the text does not already have. No display name
    (usually a file name) and no labels: both dilute the embedding of a short caption, measured
    in docs/search.md.
    Version "3": version 2 with traditional Chinese written in simplified form
    (app/search/hanzi.py: PP-OCRv5 reads some simplified captions with traditional characters);
    queries are folded the same way (:func:`semantic_query`).
    Version "4": version 3 where lines (of the text, title and description) with
    neither a letter of any script nor an emoji are left out — ``1 1 11``, ``))``, ``0.0``: in OCR
    text mostly drawn strokes read as characters, which alone carry no meaning a text model can
    use (lexical search still has them). Measured in docs/search-log.md ("Where the paraphrase points
    go"): the only step between the captions and the served ranking that loses queries, besides
    OCR misreading letters.
    Version "5" (the default): version 4, plus — when the Chinese internet-slang glossary
    (app/search/slang.py) finds terms in the image's text, title, description or tags — one
    last line with their plain-language glosses (躺平 → 放弃努力 不想奋斗 不争不抢), in order
    of first appearance: the text models do not know slang, so a paraphrase query in plain words
    missed such captions (docs/search-log.md, "Internet-slang glossary"). Without slang, the same
    document as version 4.
    """
    if version not in DOCUMENT_VERSIONS:
        raise ValueError(f"unknown document_version {version!r}")
    ctx = whitelisted_context(context)
    if version in ("4", "5"):
        ctx = {**ctx, **{k: _worded_lines(ctx[k]) for k in ("ocr_text", "title", "description")}}
    if version == "5":
        return _with_glosses(to_simplified(_meaning_document(ctx)), ctx)
    if version in ("3", "4"):
        return to_simplified(_meaning_document(ctx))
    if version == "2":
        return _meaning_document(ctx)
    lines = []
    if display_name:
        lines.append(f"name: {display_name}")
    if ctx["title"]:
        lines.append(f"title: {ctx['title']}")
    if ctx["description"]:
        lines.append(f"description: {ctx['description']}")
    if ctx["ocr_text"]:
        lines.append(f"text: {ctx['ocr_text']}")
    if ctx["tags"]:
        lines.append("tags: " + ", ".join(ctx["tags"]))
    return "\n".join(lines)


def semantic_query(query: str, version: str = "1") -> str:
    """A search query as the text embedding of ``document_version`` ``version`` expects it: the
    same script folding as the documents (versions "3" to "5": traditional → simplified; version
    5's glosses are document-side only — expanding queries the same way was measured to change
    nothing), after NFKC: a Chinese input method's full-width ``ｍｏｎｄａｙ`` or a ligature is the
    word the English-only models know (and is routed to them, app/search/service.py); e5 applies
    the same per-character folding itself (its vectors of the benchmark's queries are unchanged)."""
    if version not in ("3", "4", "5"):
        return query
    return to_simplified(unicodedata.normalize("NFKC", query))


def _with_glosses(document: str, ctx: dict[str, Any]) -> str:
    """``document`` with a last line of the Chinese slang glosses of ``ctx``'s text fields."""
    fields = (ctx["ocr_text"], ctx["title"], ctx["description"], ", ".join(ctx["tags"]))
    glosses = slang.chinese().glosses(fields)
    if not glosses:
        return document
    line = "；".join(glosses)
    return f"{document}\n{line}" if document else line


def _worded_lines(text: str) -> str:
    """The lines of ``text`` that hold a letter (any script) or an emoji/other symbol."""
    return "\n".join(
        line for line in text.split("\n")
        if any(unicodedata.category(ch) in _WORD_CATEGORIES for ch in line)
    )


_WORD_CATEGORIES = frozenset(("Lu", "Ll", "Lt", "Lm", "Lo", "So"))  # letters; emoji and other symbols


def _meaning_document(ctx: dict[str, Any]) -> str:
    parts: list[str] = []

    def seen(piece: str) -> bool:
        folded = piece.casefold()
        return any(folded in p.casefold() for p in parts)

    for piece in (ctx["ocr_text"].strip(), ctx["title"].strip(), ctx["description"].strip()):
        if piece and not seen(piece):
            parts.append(piece)
    tags = [t.strip() for t in ctx["tags"] if t.strip() and not seen(t.strip())]
    if tags:
        parts.append(", ".join(tags))
    return "\n".join(parts)


def config_hash(config: Mapping[str, Any]) -> str:
    return sha256_hex(dict(config))


def visual_fingerprint(image_sha256: str, visual_config: Mapping[str, Any]) -> str:
    return _memoised(_visual_fingerprint, image_sha256, visual_config["model"], visual_config["preprocess_version"],
                     int(visual_config["dims"]))


def agent_fingerprint(image_sha256: str, agent_config_hash: str, reverse_image_policy: str) -> str:
    return _memoised(_agent_fingerprint, image_sha256, agent_config_hash, reverse_image_policy)


def text_fingerprint(image_sha256: str, metadata_hash_: str, text_config: Mapping[str, Any]) -> str:
    return _memoised(_text_fingerprint, image_sha256, metadata_hash_, text_config["model"], int(text_config["dims"]),
                     text_config.get("document_version", "1"))


def _memoised(fn, *args: Any) -> str:
    try:
        return fn(*args)
    except TypeError:  # an unhashable config value (a list): computed, not memoised
        return fn.__wrapped__(*args)


# The planner asks for every stage's fingerprint each time it advances a job (3–4 times per job,
# mostly in one worker): pure functions of their arguments, so memoised. ``typed``: 1, 1.0 and True
# encode differently, so they must not share an entry.
@functools.lru_cache(maxsize=4096, typed=True)
def _visual_fingerprint(image_sha256: str, model: Any, preprocess_version: Any, dims: int) -> str:
    return sha256_hex(
        {
            "stage": "visual",
            "image_sha256": image_sha256,
            "model": model,
            "preprocess_version": preprocess_version,
            "dims": dims,
        }
    )


@functools.lru_cache(maxsize=4096, typed=True)
def _agent_fingerprint(image_sha256: str, agent_config_hash: str, reverse_image_policy: str) -> str:
    return sha256_hex(
        {
            "stage": "agent",
            "image_sha256": image_sha256,
            "agent_config_hash": agent_config_hash,
            "reverse_image_policy": reverse_image_policy,
        }
    )


@functools.lru_cache(maxsize=4096, typed=True)
def _text_fingerprint(image_sha256: str, metadata_hash_: Any, model: Any, dims: int, document_version: Any) -> str:
    return sha256_hex(
        {
            "stage": "text_embedding",
            "image_sha256": image_sha256,
            "metadata_hash": metadata_hash_,
            "model": model,
            "dims": dims,
            "document_version": document_version,
        }
    )


def dedupe_key(image_id: Any, stage: str, input_fingerprint: str) -> str:
    """Identical work on one image has one key; unique among active tasks of a scope."""
    return sha256_hex({"image_id": str(image_id), "stage": stage, "fingerprint": input_fingerprint})
