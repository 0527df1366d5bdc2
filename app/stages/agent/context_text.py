"""How a context's title and tags read, whoever writes them — a human (PATCH
/api/v1/images/{id}) or an agent: a title is one line; a tag is trimmed with its whitespace runs
made single spaces, and a list of tags holds no empty tag and no tag twice ("Cat", "cat" and the
full-width "Ｃａｔ" are one tag, spelled as it came first, in the order given). The limits of
:mod:`app.stages.agent.limits` apply to the values made here. Pure functions."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable


def single_line(text: str) -> str:
    """``text`` trimmed, each run of whitespace (line breaks, tabs, U+3000 included) one space."""
    return " ".join(text.split())


def tag_key(tag: str) -> str:
    """What makes two tags one tag: Unicode compatibility forms (full-width letters, ligatures),
    case and whitespace runs do not count (NFKC, casefold, NFKC again: caseless matching)."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", tag).casefold())
    return single_line(folded)


def normalise_tags(tags: Iterable[str]) -> list[str]:
    """Each tag as :func:`single_line`; empty tags dropped; a tag whose :func:`tag_key` came
    before dropped (the first spelling is kept); the order kept."""
    seen: set[str] = set()
    out: list[str] = []
    for raw in tags:
        tag = single_line(raw)
        key = tag_key(tag)
        if tag and key not in seen:
            seen.add(key)
            out.append(tag)
    return out
