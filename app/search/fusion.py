"""Hybrid ranking: pure functions from candidate signals to one ordered list (no database).

Two signals per candidate image:
- ``cosine`` — the query embedding against the image's current text embedding (None when the
  image has no current embedding yet);
- ``lexical`` — the IDF-weighted share of the query's terms the image's current text contains
  (``lexical_score``): 1.0 when it has every term, a rare term weighing more than a common one.

Fusing them is not free: a lexical list fused by rank (RRF) lets weak matches on common words
outrank the semantic answer to a paraphrase (measured, docs/search.md). So the lexical signal only
*adds* to the semantic score, and only the part of it above a gate — a strong lexical match
(most of the query's IDF mass present) lifts an image; a weak one (one common word) changes
nothing. The constants are chosen on the search benchmark per language × query type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# Defaults chosen on bench/search_quality.py (docs/search.md): see FusionParams.
LEXICAL_GATE = 0.3
LEXICAL_WEIGHT = 0.1
# A query word that the image's text holds only one edit away (an OCR misread, see
# ``lexical.near_terms``) counts this much of its idf (0 = exact terms only).
NEAR_MATCH_WEIGHT = 0.5


@dataclass(frozen=True)
class FusionParams:
    """How much a strong lexical match lifts an image: ``weight`` × the part of its lexical score
    above ``gate`` (rescaled to 0..1)."""

    gate: float = LEXICAL_GATE
    weight: float = LEXICAL_WEIGHT
    near: float = NEAR_MATCH_WEIGHT


@dataclass
class Candidate:
    """One image found by at least one signal."""

    image_id: str
    cosine: float | None = None
    matched_terms: list[str] = field(default_factory=list)
    near_terms: list[str] = field(default_factory=list)  # query terms met only one edit away
    lexical: float = 0.0
    semantic_rank: int | None = None
    lexical_rank: int | None = None
    score: float = 0.0


def idf(df: int, n: int) -> float:
    """BM25's idf: always positive, larger for rarer terms."""
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


def lexical_score(matched: Sequence[str], terms: Sequence[str], df: Mapping[str, int], n: int,
                  near: Sequence[str] = (), near_weight: float = NEAR_MATCH_WEIGHT) -> float:
    """Share of the query's IDF mass that ``matched`` covers (0..1); a term in ``near`` (met one
    edit away, not exactly) counts ``near_weight`` of its idf."""
    total = sum(idf(df.get(t, 0), n) for t in terms)
    if total <= 0:
        return 0.0
    wanted, close = set(matched), set(near) - set(matched)
    return sum(idf(df.get(t, 0), n) * (1.0 if t in wanted else near_weight if t in close else 0.0)
               for t in terms) / total


def rank_lexical(cands: list[Candidate]) -> list[Candidate]:
    """Lexical mode: by lexical score, then by cosine where known (ties among equal matches)."""
    found = [c for c in cands if c.lexical > 0]
    return sorted(found, key=lambda c: (-c.lexical, -(c.cosine if c.cosine is not None else -2.0), c.image_id))


def rank_semantic(cands: list[Candidate]) -> list[Candidate]:
    """Semantic mode: by cosine only."""
    found = [c for c in cands if c.cosine is not None]
    return sorted(found, key=lambda c: (-(c.cosine or 0.0), c.image_id))


def lexical_boost(lexical: float, params: FusionParams) -> float:
    """The gated lexical lift of one candidate."""
    if lexical <= params.gate or params.gate >= 1.0:
        return 0.0
    return params.weight * (lexical - params.gate) / (1.0 - params.gate)


def fuse(cands: list[Candidate], params: FusionParams = FusionParams()) -> list[Candidate]:
    """Hybrid mode: cosine + gated lexical lift. An image with no current embedding yet (lexical
    match only) is scored from the lowest cosine among the candidates, so it ranks by its match."""
    cosines = [c.cosine for c in cands if c.cosine is not None]
    floor = min(cosines) if cosines else 0.0
    for c in cands:
        base = c.cosine if c.cosine is not None else floor
        c.score = base + lexical_boost(c.lexical, params)
    return sorted(cands, key=lambda c: (-c.score, c.image_id))
