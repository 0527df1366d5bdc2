"""Read-only SQL of text search: semantic and lexical candidates of one scope, index-driven.

Only *current* text counts. A text embedding is current when its image_sha256 and metadata_hash
equal the image's; the lexical terms (``images.search_tsv``) are written by the same statement
as the context they come from, so they are current by construction. ``dims`` is formatted into
the SQL as an integer literal because the HNSW index expression is ``embedding::vector(<dims>)``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pgvector import Vector
from sqlalchemy import Engine, text

from app.db.engine import scope_vector_index_name
from app.search.lexical import tsquery_source

log = logging.getLogger(__name__)

IMAGE_COLUMNS = (
    "i.id, i.display_name, i.sha256, i.media_type, i.size_bytes, i.width, i.height, i.context, "
    "i.context_status, i.metadata_hash, i.revision, i.created_at, i.updated_at"
)
LATEST_JOB = (
    "(SELECT json_build_object('id', j.id, 'status', j.status) FROM processing_jobs j "
    " WHERE j.scope_id = i.scope_id AND j.image_id = i.id ORDER BY j.revision DESC LIMIT 1) AS latest_job"
)
_CURRENT_TEXT = (
    "t.scope_id = i.scope_id AND t.image_id = i.id AND t.image_sha256 = i.sha256"
    " AND t.metadata_hash = i.metadata_hash AND t.status = 'ready' AND t.model = :m AND t.dims = :d"
)

# The same condition as a per-row filter: a scalar subquery stays a filter of the HNSW index scan
# (iterative scans go on until :k rows pass it), where a join to images is misestimated (three
# correlated equalities: "1 row") and makes the planner sort the whole scope instead.
CURRENT_TEXT_FILTER = (
    "(SELECT true FROM images i WHERE i.scope_id = t.scope_id AND i.id = t.image_id"
    " AND i.sha256 = t.image_sha256 AND i.metadata_hash = t.metadata_hash)"
)


def vector_literal(vec: Sequence[float]) -> str:
    """pgvector's text form of ``vec`` (bound as text and cast in the SQL)."""
    return Vector(list(vec)).to_text()


def iterative_scan(conn: Any) -> None:
    """Let HNSW keep scanning when the scope filter discards candidates (pgvector >= 0.8)."""
    conn.execute(text("SET LOCAL hnsw.iterative_scan = relaxed_order"))
    conn.execute(text(f"SET LOCAL hnsw.ef_search = {int(HNSW_EF_SEARCH)}"))
    # plan with the scope id's value, so a scope's own HNSW index (``scope_indexes.ensure_scope_vector_indexes``)
    # is used: psycopg prepares a statement on its fifth run and a generic plan can't prove the
    # partial index's ``scope_id = …`` predicate
    conn.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))


# All scopes' vectors of a model share one HNSW index. A scope filter discards the other scopes'
# neighbours, and a filtered scan of the shared index misses a small or mid-size scope's nearest
# rows: at 1M vectors recall@10 0.83–0.93 for scopes of 2.4–19 % of the index, whatever
# hnsw.max_scan_tuples, scan_mem_multiplier, strict_order or over-fetching (the graph search with
# the filter never reaches them). So a scope of at most EXACT_SCAN_MAX_IMAGES images is searched
# exactly (its rows through the (scope_id, …) unique btree, every distance computed: cost ∝ the
# scope's size, recall 1); a larger one below half the images gets its own partial HNSW index
# (app.orchestrator.scope_indexes, built by maintenance), which the planner picks for a query naming the
# scope (recall@10 1.0); the largest scopes use the shared index. HNSW_EF_SEARCH 1000 (pgvector's
# maximum): at 400 a query of the 500k scope in 3 got 0 of its 10 (a graph search stuck in a
# wrong cluster). All chosen by measurement (bench/search_scale.py, docs/performance-log.md §8).
EXACT_SCAN_MAX_IMAGES = 20_000
HNSW_EF_SEARCH = 1000
#: A scope of at least this share of all images gets no index of its own (the shared one is mostly its own).
SCOPE_INDEX_MAX_SHARE = 0.5
#: Up to this size, a scope that should have its own index but has no valid one yet (maintenance
#: builds it within MEMEFLOW_SEARCH_INDEX_INTERVAL_S of the scope crossing the exact-scan size, or an
#: interrupted build left it invalid) is still searched exactly, not through the shared index with
#: its 0.83–0.93 recall for such scopes: recall stays 1 meanwhile, at ≤ 3× the exact scan's cost.
EXACT_SCAN_FALLBACK_MAX_IMAGES = 60_000

_SCOPE_IMAGES = text("SELECT image_count FROM scope_usage WHERE scope_id = :s")
_OWN_INDEX_VALID = text(
    "SELECT coalesce((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(CAST(:n AS text))), false)"
)
_ALL_IMAGES = text("SELECT coalesce(sum(image_count), 0) FROM scope_usage")


def exact_scan(conn: Any, scope_id: str, own_index: str | None = None) -> bool:
    """Whether to search the scope by an exact scan: its image count (``scope_usage``, kept by a
    trigger on ``images``, migration 0013 — one primary-key read) is at most EXACT_SCAN_MAX_IMAGES;
    or, given the name of the scope's own index of the model searched (``own_index``), the scope is
    at most EXACT_SCAN_FALLBACK_MAX_IMAGES, below SCOPE_INDEX_MAX_SHARE of all images, and that
    index is not (yet) valid."""
    n = int(conn.execute(_SCOPE_IMAGES, {"s": scope_id}).scalar() or 0)
    if n <= EXACT_SCAN_MAX_IMAGES:
        return True
    if own_index is None or n > EXACT_SCAN_FALLBACK_MAX_IMAGES or conn.execute(_OWN_INDEX_VALID, {"n": own_index}).scalar():
        return False
    return n < SCOPE_INDEX_MAX_SHARE * int(conn.execute(_ALL_IMAGES).scalar())


def candidates(
    engine: Engine, scope_id: str, *, model: str | None, dims: int | None, vector: Sequence[float] | None,
    terms: list[str], k: int,
) -> list[dict[str, Any]]:
    """Up to ``k`` nearest current embeddings and up to ``k`` best lexical matches of the scope —
    their union, each row with the image's columns, ``cosine`` (None without a current embedding)
    and ``matched_terms`` (which of ``terms`` its text contains), and ``sem_rank``/``lex_rank``
    (1-based position in each list, None when not in it). After an exact scan every row also
    carries ``current_text`` (the scope's images with a current embedding of the model) and
    ``current_total`` (its images): the text coverage; both None otherwise.
    Either signal may be absent: ``vector`` None skips the semantic list, ``terms`` empty the lexical one.
    """
    semantic = vector is not None and model is not None and dims is not None
    lexical = bool(terms)
    if not semantic and not lexical:
        return []
    with engine.begin() as conn:
        exact = semantic and exact_scan(conn, scope_id, scope_vector_index_name("text_embeddings", model, dims, scope_id))
        if semantic and not exact:
            iterative_scan(conn)
        sql, params = _candidates_sql(scope_id, model=model, dims=dims, vector=vector, terms=terms, k=k,
                                      semantic=semantic, lexical=lexical, exact=exact)
        return [dict(r._mapping) for r in conn.execute(sql, params)]


def _candidates_sql(
    scope_id: str, *, model: str | None, dims: int | None, vector: Sequence[float] | None, terms: list[str],
    k: int, semantic: bool, lexical: bool, exact: bool,
) -> tuple[Any, dict[str, Any]]:
    d = int(dims or 0)
    qv = f"CAST(:q AS vector({d}))"
    parts = []
    if semantic and exact:  # distances materialized before the sort: no index can serve it
        parts.append(
            f"d AS MATERIALIZED (SELECT t.image_id, t.embedding::vector({d}) <=> {qv} AS dist"
            f" FROM text_embeddings t JOIN images i ON {_CURRENT_TEXT}"
            f" WHERE t.scope_id = :s AND t.model = :m AND t.dims = :d AND t.status = 'ready')"
        )
        parts.append(
            "sem AS MATERIALIZED (SELECT image_id, row_number() OVER (ORDER BY dist, image_id) AS sem_rank FROM ("
            " SELECT image_id, dist FROM d ORDER BY dist, image_id LIMIT :k) t)"
        )
    elif semantic:
        parts.append(
            "sem AS MATERIALIZED (SELECT t.image_id, row_number() OVER () AS sem_rank FROM ("
            f" SELECT t.image_id FROM text_embeddings t"
            f" WHERE t.scope_id = :s AND t.model = :m AND t.dims = :d AND t.status = 'ready' AND {CURRENT_TEXT_FILTER}"
            f" ORDER BY t.embedding::vector({d}) <=> {qv} LIMIT :k) t)"
        )
    else:
        parts.append("sem AS (SELECT NULL::uuid AS image_id, NULL::bigint AS sem_rank WHERE false)")
    if lexical:
        parts.append(
            "lex AS MATERIALIZED (SELECT id AS image_id, row_number() OVER (ORDER BY r DESC, id) AS lex_rank FROM ("
            " SELECT i.id, ts_rank(i.search_tsv, to_tsquery('simple', :tsq)) AS r FROM images i"
            " WHERE i.scope_id = :s AND i.search_tsv @@ to_tsquery('simple', :tsq)"
            " ORDER BY r DESC, i.id LIMIT :k) x)"
        )
    else:
        parts.append("lex AS (SELECT NULL::uuid AS image_id, NULL::bigint AS lex_rank WHERE false)")
    cosine = (
        f"(SELECT 1 - (t.embedding::vector({d}) <=> {qv}) FROM text_embeddings t WHERE {_CURRENT_TEXT} LIMIT 1)"
        if semantic else "NULL::float8"
    )
    matched = (
        "ARRAY(SELECT term FROM unnest(CAST(:terms AS text[])) AS term"
        " WHERE i.search_tsv @@ to_tsquery('simple', quote_literal(term)))"
        if lexical else "ARRAY[]::text[]"
    )
    # the exact scan has every current embedding of the scope in hand: their number and the scope's
    # image count (``scope_usage``) are the search's text coverage, at no further scan
    # (``current_text``/``current_total``; NULL on the other paths)
    current = (
        "(SELECT count(*) FROM d) AS current_text,"
        " (SELECT coalesce(max(image_count), 0) FROM scope_usage WHERE scope_id = :s) AS current_total"
        if semantic and exact else "NULL::bigint AS current_text, NULL::bigint AS current_total"
    )
    sql = text(
        "WITH " + ", ".join(parts) + ","
        " cand AS (SELECT coalesce(sem.image_id, lex.image_id) AS image_id, sem.sem_rank, lex.lex_rank"
        "  FROM sem FULL JOIN lex ON lex.image_id = sem.image_id)"
        f" SELECT {IMAGE_COLUMNS}, {LATEST_JOB}, cand.sem_rank, cand.lex_rank,"
        f" {cosine} AS cosine, {matched} AS matched_terms, {current}"
        " FROM cand JOIN images i ON i.scope_id = :s AND i.id = cand.image_id"
    )
    params: dict[str, Any] = {"s": scope_id, "k": int(k)}
    if semantic:
        params.update(m=model, d=d, q=vector_literal(vector or []))
    if lexical:
        params.update(tsq=tsquery_source(terms), terms=list(terms))
    return sql, params


# vector_send: pgvector's binary form (int16 dims, int16 unused, dims big-endian float4) — decoding
# it is ~0.01 ms per 1152-dim vector where parsing the text form took ~0.37 ms (the query bank reads 20)
_TEXT_VECTORS = text(
    "SELECT t.image_id, vector_send(t.embedding) AS embedding FROM text_embeddings t JOIN images i ON " + _CURRENT_TEXT +
    " WHERE t.scope_id = :s AND t.image_id = ANY(CAST(:ids AS uuid[])) AND t.model = :m AND t.dims = :d"
    " AND t.status = 'ready'"
)


def text_vectors(engine: Engine, scope_id: str, image_ids: Sequence[str], *, model: str, dims: int
                 ) -> dict[str, np.ndarray]:
    """The current stored text vectors of ``image_ids`` (a search's top candidates), by image id,
    as float32 arrays holding exactly the stored values."""
    if not image_ids:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(_TEXT_VECTORS, {"s": scope_id, "ids": list(image_ids), "m": model, "d": int(dims)})
        return {str(r.image_id): vector_from_binary(bytes(r.embedding)) for r in rows}


def vector_from_binary(data: bytes) -> np.ndarray:
    """A vector from pgvector's binary form (``vector_send``)."""
    dims = int.from_bytes(data[:2], "big")
    if len(data) != 4 + 4 * dims:
        raise ValueError(f"a binary vector of {dims} dims must be {4 + 4 * dims} bytes, got {len(data)}")
    return np.frombuffer(data, dtype=">f4", offset=4).astype(np.float32)


def term_frequencies(engine: Engine, scope_id: str, terms: list[str]) -> tuple[dict[str, int], int]:
    """(documents of the scope containing each term, documents with any lexical text) — the
    inputs of BM25's idf; one GIN index scan per term."""
    if not terms:
        return {}, 0
    sql = text(
        "SELECT term, (SELECT count(*) FROM images i WHERE i.scope_id = :s"
        "  AND i.search_tsv @@ to_tsquery('simple', quote_literal(term))) AS df"
        " FROM unnest(CAST(:terms AS text[])) AS term"
        " UNION ALL SELECT NULL, (SELECT coalesce(max(image_count), 0) FROM scope_usage WHERE scope_id = :s)"
    )
    with engine.connect() as conn:
        rows = conn.execute(sql, {"s": scope_id, "terms": list(terms)}).all()
    df = {r.term: int(r.df) for r in rows if r.term is not None}
    n = next(int(r.df) for r in rows if r.term is None)
    return df, n


# A coverage count reads every image of the scope: O(scope), about 0.4 s per 100k images on the
# 2-core box. Above EXACT_SCAN_MAX_IMAGES images a search reports this process's last count, at most
# COVERAGE_MAX_AGE_S old before a background thread recounts it (the first search counts inline).
COVERAGE_MAX_AGE_S = 30.0
_counts: dict[tuple[str, ...], tuple[float, dict[str, int]]] = {}
_recounting: set[tuple[str, ...]] = set()
_counts_lock = threading.Lock()


def cached_count(engine: Engine, scope_id: str, key: tuple[str, ...], count: Callable[[], dict[str, int]]
                 ) -> dict[str, int]:
    """``count()`` for a scope within EXACT_SCAN_MAX_IMAGES images; for a larger one the last result
    for (engine, scope, ``key``), recounted in the background once older than COVERAGE_MAX_AGE_S."""
    with engine.connect() as conn:
        if exact_scan(conn, scope_id):
            return count()
    k = (str(engine.url), scope_id, *key)
    with _counts_lock:
        hit = _counts.get(k)
        recount = hit is not None and time.monotonic() - hit[0] > COVERAGE_MAX_AGE_S and k not in _recounting
        if recount:
            _recounting.add(k)
    if hit is None:
        value = count()
        with _counts_lock:
            _counts[k] = (time.monotonic(), value)
        return value
    if recount:
        threading.Thread(target=_recount, args=(k, count), daemon=True, name="coverage-recount").start()
    return hit[1]


def _recount(k: tuple[str, ...], count: Callable[[], dict[str, int]]) -> None:
    try:
        value = count()
        with _counts_lock:
            _counts[k] = (time.monotonic(), value)
    except Exception:  # a failed recount keeps the previous value; the next stale read retries
        log.warning("coverage recount failed", exc_info=True)
    finally:
        with _counts_lock:
            _recounting.discard(k)


def text_coverage(engine: Engine, scope_id: str, *, model: str) -> dict[str, int]:
    """How many images of the scope have a current text embedding for ``model`` (``cached_count``)."""
    return cached_count(engine, scope_id, ("text", model), lambda: _text_coverage(engine, scope_id, model=model))


def _text_coverage(engine: Engine, scope_id: str, *, model: str) -> dict[str, int]:
    # count(*), not count(DISTINCT i.id): the join names every column of text_embeddings' unique
    # key (scope, image, sha256, metadata_hash, model), so an image joins at most one row — and
    # the DISTINCT's sort was a third of the count's time (docs/performance-log.md §47)
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM images WHERE scope_id = :s) AS total, "
                "(SELECT count(*) FROM images i JOIN text_embeddings t "
                "  ON t.scope_id = i.scope_id AND t.image_id = i.id AND t.image_sha256 = i.sha256 "
                "  AND t.metadata_hash = i.metadata_hash AND t.model = :m AND t.status = 'ready' "
                "  WHERE i.scope_id = :s) AS ready"
            ),
            {"s": scope_id, "m": model},
        ).one()
    return {"ready": int(row.ready), "total": int(row.total)}


def lexical_coverage(engine: Engine, scope_id: str) -> dict[str, int]:
    """How many images of the scope have lexical text (a current context or a display name;
    ``cached_count``)."""
    return cached_count(engine, scope_id, ("lexical",), lambda: _lexical_coverage(engine, scope_id))


def _lexical_coverage(engine: Engine, scope_id: str) -> dict[str, int]:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT count(*) AS total, count(*) FILTER (WHERE search_tsv <> ''::tsvector) AS ready"
                " FROM images WHERE scope_id = :s"
            ),
            {"s": scope_id},
        ).one()
    return {"ready": int(row.ready), "total": int(row.total)}
