"""Text search as the API and the CLI serve it: embed the query, gather both signals, rank.

``mode``: ``hybrid`` (default) — semantic and lexical candidates fused (app/search/fusion.py);
``semantic`` — nearest current text embeddings only; ``lexical`` — current text terms only.
With a text provider made of several models (app/stages/text/composite.py) the query's parts
are weighted per query (``route_weights``) or, with ``model=``, one model alone.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import Engine

from app.orchestrator.fingerprints import semantic_query
from app.search import fusion, lexical, qbnorm
from app.search import queries as Q
from app.stages.vectors import vector_problem

log = logging.getLogger(__name__)

MODES = ("hybrid", "semantic", "lexical")
_CANDIDATES = 100  # per signal; the fused list is cut to ``limit`` after ranking


class UnknownModel(ValueError):
    """``model=`` names no part of the configured text provider."""


class QueryNotEmbeddable(ValueError):
    """The text provider answered the query with a vector no cosine can use (NaN, infinite, past
    float4, all zeros, or not the model's dimensions): the same check a stored vector passes
    (app/stages/vectors.py). The lexical signal, which never embeds the query, still answers it."""


def provider_parts(provider: Any) -> list[str]:
    """The model names whose embeddings the provider's vector holds (one for a single model)."""
    parts = getattr(provider, "part_names", None)
    if parts:
        return list(parts() if callable(parts) else parts)
    return [str(provider.config()["model"])]


def scored_parts(provider: Any) -> list[str]:
    """The parts a query is scored against: every part but the query banks (composite.py)."""
    banks = getattr(provider, "banks", None) or {}
    return [p for p in provider_parts(provider) if p not in banks]


# A query in Latin script weighs English-only models this much more than multilingual ones
# (measured on the benchmark's English queries: e5:MiniLM 1:1 → paraphrase r@1 0.717, 1:1.5 → 0.726
# with exact still 1.000, 1:2 → 0.736 but exact 0.991; docs/search.md).
LATIN_SPECIALIST_WEIGHT = 1.5


def route_weights(query: str, parts: Sequence[str]) -> dict[str, float] | None:
    """Per-model weights for a query (None = the provider's default, equal weights). A query with a
    letter of a non-Latin script (Chinese, Cyrillic, Thai …) is served by the multilingual model(s)
    alone: English-only models place all such text near each other and only add noise. Any other
    query uses every model, the English-only ones weighted ``LATIN_SPECIALIST_WEIGHT`` (measured,
    docs/search.md)."""
    if len(parts) < 2:
        return None
    multilingual = [p for p in parts if "multilingual" in p]
    if not multilingual or len(multilingual) == len(parts):
        return None
    if lexical.has_non_latin_letters(query):
        return {p: (1.0 if p in multilingual else 0.0) for p in parts}
    return {p: (1.0 if p in multilingual else LATIN_SPECIALIST_WEIGHT) for p in parts}


def embed_query(provider: Any, query: str, *, model: str | None = None) -> tuple[list[float], dict[str, float] | None]:
    """The query vector in the provider's space, and the per-model weights it was made with."""
    parts = scored_parts(provider)
    weights = None
    if model is not None:
        if model not in parts:
            raise UnknownModel(f"unknown model {model!r}; this deployment serves {', '.join(parts)}")
        weights = {p: (1.0 if p == model else 0.0) for p in parts} if len(parts) > 1 else None
    else:
        weights = route_weights(query, parts)
    if weights is None and getattr(provider, "banks", None):  # equal scored parts, the banks at 0
        weights = {p: 1.0 for p in parts}
    if weights is not None:
        return list(provider.embed_query([query], weights=weights)[0]), weights
    embed = getattr(provider, "embed_query", None) or provider.embed
    return list(embed([query])[0]), None


def cosine_scale(k: int, weights: dict[str, float] | None) -> float:
    """Factor that turns the stored vector's cosine into the weighted mean of the per-model
    cosines, Σ wᵢcᵢ / Σ wᵢ: the concatenated vector's cosine is Σ wᵢcᵢ / (√k · √Σwᵢ²) (see
    app/stages/text/composite.py). So scores read the same whichever models a query used."""
    if k < 2 or not weights:
        return 1.0
    total = sum(weights.values())
    return math.sqrt(k) * math.sqrt(sum(w * w for w in weights.values())) / total if total > 0 else 1.0


def search_text(
    engine: Engine, provider: Any, scope_id: str, query: str, *, limit: int = 20, mode: str = "hybrid",
    model: str | None = None, params: fusion.FusionParams | None = None,
) -> dict[str, Any]:
    """The response of ``GET /api/v1/search/text`` (items, mode, model, models, coverage)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    config = provider.config()
    stored_model, dims = str(config["model"]), int(config["dims"])
    parts = scored_parts(provider)
    k_parts = len(provider_parts(provider))
    terms = lexical.query_terms(query) if mode in ("hybrid", "lexical") else []
    vector, weights = (None, None)
    if mode in ("hybrid", "semantic"):
        # the documents' script folding (document_version "3": traditional → simplified)
        semantic = semantic_query(query, str(config.get("document_version", "1")))
        raw, weights = embed_query(provider, semantic, model=model)
        vector, problem = vector_problem(raw, dims)
        if problem is not None:
            log.warning("the text provider %s answered a query with an unusable vector (%s)", stored_model, problem)
            raise QueryNotEmbeddable(
                f"the text model {stored_model} cannot embed this query (its vector is {problem.replace('_', ' ')}); "
                "search it with mode=lexical, or rephrase it")
    rows = Q.candidates(engine, scope_id, model=stored_model if vector is not None else None, dims=dims,
                        vector=vector, terms=terms, k=max(_CANDIDATES, limit))
    df, n = Q.term_frequencies(engine, scope_id, terms) if terms and rows else ({}, 0)
    scale = cosine_scale(k_parts, weights)
    params = params or fusion.FusionParams()
    words = lexical.query_words(query) if terms and params.near > 0 else {}
    cands: dict[str, fusion.Candidate] = {}
    for row in rows:
        cosine = None if row["cosine"] is None else float(row["cosine"]) * scale
        c = fusion.Candidate(image_id=str(row["id"]), cosine=cosine, matched_terms=list(row["matched_terms"]))
        if words:  # OCR misreads: query words the image's text holds one edit away
            c.near_terms = lexical.near_terms(words, [t for t in terms if t not in c.matched_terms],
                                              lexical.lexical_fields(row["display_name"], _indexed_context(row)))
        c.lexical = fusion.lexical_score(c.matched_terms, terms, df, n, c.near_terms, params.near) if terms else 0.0
        cands[c.image_id] = c
    qb_applied = False
    if vector is not None and model is None:
        qb_applied = _query_bank(engine, provider, scope_id, cands, weights, stored_model=stored_model, dims=dims)
    _assign_ranks(list(cands.values()), semantic=vector is not None, lexical_on=bool(terms))
    if mode == "semantic":
        ranked = fusion.rank_semantic(list(cands.values()))
        for c in ranked:
            c.score = c.cosine or 0.0
    elif mode == "lexical":
        ranked = fusion.rank_lexical(list(cands.values()))
        for c in ranked:
            c.score = c.lexical
    else:
        ranked = fusion.fuse(list(cands.values()), params)
    by_id = {str(r["id"]): r for r in rows}
    items = [_hit(by_id[c.image_id], c, terms) for c in ranked[:limit]]
    coverage = _coverage_of(rows) or Q.text_coverage(engine, scope_id, model=stored_model)
    models = [
        {"name": p, "weight": (weights or {}).get(p, 1.0) if weights else 1.0, "stored_as": stored_model,
         "coverage": coverage}
        for p in parts
    ] if mode != "lexical" else []
    return {
        "items": items, "mode": mode, "model": stored_model, "models": models, "coverage": coverage,
        "query_bank": {"applied": qb_applied} if vector is not None and getattr(provider, "banks", None) else None,
        "lexical": {"terms": terms, "coverage": Q.lexical_coverage(engine, scope_id)} if mode != "semantic" else None,
    }


def _query_bank(engine: Engine, provider: Any, scope_id: str, cands: dict[str, fusion.Candidate],
                weights: dict[str, float] | None, *, stored_model: str, dims: int) -> bool:
    """Query-bank normalisation (app/search/qbnorm.py) of a query scored by ONE part that has a
    bank (the CJK route: e5 alone); re-orders the top candidates' cosines in place."""
    banks = getattr(provider, "banks", None) or {}
    scored = [p for p, w in weights.items() if w > 0] if weights else scored_parts(provider)
    pairs = [(b, p) for b, p in banks.items() if scored == [p]]
    if not pairs:
        return False
    bank_part, part = pairs[0]
    cosines = {i: c.cosine for i, c in cands.items() if c.cosine is not None}
    top = qbnorm.top_ids(cosines)
    vectors = Q.text_vectors(engine, scope_id, top, model=stored_model, dims=dims)
    slices, unscale = provider.slices(), math.sqrt(len(provider_parts(provider)))
    bank = {i: v[slices[bank_part]].astype(np.float64) * unscale for i, v in vectors.items()}
    passages = {i: v[slices[part]].astype(np.float64) * unscale for i, v in vectors.items()}
    new = qbnorm.reorder({i: cosines[i] for i in top}, bank, passages)
    if new is None:
        return False
    for i, cosine in new.items():
        cands[i].cosine = cosine
    return True


def _coverage_of(rows: list[dict[str, Any]]) -> dict[str, int] | None:
    """The text coverage an exact scan counted along (``Q.candidates``), None when it did not run."""
    for row in rows:
        if row.get("current_text") is not None:
            return {"ready": int(row["current_text"]), "total": int(row["current_total"])}
    return None


def _assign_ranks(cands: list[fusion.Candidate], *, semantic: bool, lexical_on: bool) -> None:
    if semantic:
        for rank, c in enumerate(fusion.rank_semantic(cands), 1):
            c.semantic_rank = rank
    if lexical_on:
        for rank, c in enumerate(fusion.rank_lexical(cands), 1):
            c.lexical_rank = rank


#: The candidates' columns that are not the image's own.
_NOT_IMAGE = frozenset({"sem_rank", "lex_rank", "cosine", "matched_terms", "current_text", "current_total"})


def _indexed_context(image: dict[str, Any]) -> dict[str, Any] | None:
    """The image's context as its lexical terms hold it: none while ``pending`` — after a content
    replace the context still describes the old bytes and the terms are the display name's alone
    (store/images.py REPLACE_CONTENT), so near matches and highlights must not read it either."""
    return None if image.get("context_status") == "pending" else image.get("context")


def _hit(row: dict[str, Any], c: fusion.Candidate, terms: list[str]) -> dict[str, Any]:
    image = {k: v for k, v in row.items() if k not in _NOT_IMAGE}
    matched: dict[str, Any] = {}
    if c.semantic_rank is not None:
        matched["semantic"] = {"rank": c.semantic_rank, "score": round(float(c.cosine or 0.0), 6)}
    if c.lexical_rank is not None:
        matched["lexical"] = {"rank": c.lexical_rank, "score": round(c.lexical, 6), "terms": c.matched_terms}
    if c.near_terms:  # query terms its text holds only one edit away (an OCR misread), in the lexical score
        matched["near"] = {"terms": c.near_terms, "lexical_score": round(c.lexical, 6)}
    return {"image": image, "score": float(c.score), "matched": matched,
            "highlight": _highlight(image, c.matched_terms)}


_FIELD_SCAN_MIN = 500  # the longest title or display name the API accepts


def _highlight(image: dict[str, Any], matched_terms: list[str]) -> dict[str, Any] | None:
    """The first of the image's text fields (its current ones: ``_indexed_context``) that contains
    a matched term, around the matches.

    The fields share ``lexical.HIGHLIGHT_SCAN_CHARS`` characters of search per hit; a field after a
    long one still has its first ``_FIELD_SCAN_MIN`` (a title or a name is searched whole)."""
    if not matched_terms:
        return None
    ctx = _indexed_context(image) or {}
    tags = ctx.get("tags") or []
    budget = lexical.HIGHLIGHT_SCAN_CHARS
    for field, value in (("ocr_text", ctx.get("ocr_text")), ("title", ctx.get("title")),
                         ("description", ctx.get("description")), ("display_name", image.get("display_name")),
                         ("tags", ", ".join(map(str, tags)) if isinstance(tags, list) else None)):
        if isinstance(value, str) and value:
            found = lexical.highlight(value.replace("\n", " / "), matched_terms, scan=max(budget, _FIELD_SCAN_MIN))
            if found is not None:
                return {"field": field, **found}
            budget -= len(value)
    return None
