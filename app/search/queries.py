"""Read-only SQL of text search: semantic and lexical candidates of one scope, index-driven.

Only *current* text counts. A text embedding is current when its image_sha256 and metadata_hash
equal the image's; the lexical terms (``images.search_tsv``) are written by the same statement
as the context they come from, so they are current by construction. ``dims`` is formatted into
the SQL as an integer literal because the HNSW index expression is ``embedding::vector(<dims>)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgvector import Vector
from sqlalchemy import Engine, text

from app.search.lexical import tsquery_source

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


def vector_literal(vec: Sequence[float]) -> str:
    """pgvector's text form of ``vec`` (bound as text and cast in the SQL)."""
    return Vector(list(vec)).to_text()


def iterative_scan(conn: Any) -> None:
    """Let HNSW keep scanning when the scope filter discards candidates (pgvector >= 0.8)."""
    conn.execute(text("SET LOCAL hnsw.iterative_scan = relaxed_order"))


def candidates(
    engine: Engine, scope_id: str, *, model: str | None, dims: int | None, vector: Sequence[float] | None,
    terms: list[str], k: int,
) -> list[dict[str, Any]]:
    """Up to ``k`` nearest current embeddings and up to ``k`` best lexical matches of the scope —
    their union, each row with the image's columns, ``cosine`` (None without a current embedding)
    and ``matched_terms`` (which of ``terms`` its text contains), and ``sem_rank``/``lex_rank``
    (1-based position in each list, None when not in it).
    Either signal may be absent: ``vector`` None skips the semantic list, ``terms`` empty the lexical one.
    """
    semantic = vector is not None and model is not None and dims is not None
    lexical = bool(terms)
    if not semantic and not lexical:
        return []
    d = int(dims or 0)
    qv = f"CAST(:q AS vector({d}))"
    parts = []
    if semantic:
        parts.append(
            "sem AS MATERIALIZED (SELECT t.image_id, row_number() OVER () AS sem_rank FROM ("
            f" SELECT t.image_id FROM text_embeddings t JOIN images i ON {_CURRENT_TEXT}"
            f" WHERE t.scope_id = :s AND t.model = :m AND t.dims = :d AND t.status = 'ready'"
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
    sql = text(
        "WITH " + ", ".join(parts) + ","
        " cand AS (SELECT coalesce(sem.image_id, lex.image_id) AS image_id, sem.sem_rank, lex.lex_rank"
        "  FROM sem FULL JOIN lex ON lex.image_id = sem.image_id)"
        f" SELECT {IMAGE_COLUMNS}, {LATEST_JOB}, cand.sem_rank, cand.lex_rank,"
        f" {cosine} AS cosine, {matched} AS matched_terms"
        " FROM cand JOIN images i ON i.scope_id = :s AND i.id = cand.image_id"
    )
    params: dict[str, Any] = {"s": scope_id, "k": int(k)}
    if semantic:
        params.update(m=model, d=d, q=vector_literal(vector or []))
    if lexical:
        params.update(tsq=tsquery_source(terms), terms=list(terms))
    with engine.begin() as conn:
        if semantic:
            iterative_scan(conn)
        return [dict(r._mapping) for r in conn.execute(sql, params)]


def term_frequencies(engine: Engine, scope_id: str, terms: list[str]) -> tuple[dict[str, int], int]:
    """(documents of the scope containing each term, documents with any lexical text) — the
    inputs of BM25's idf; one GIN index scan per term."""
    if not terms:
        return {}, 0
    sql = text(
        "SELECT term, (SELECT count(*) FROM images i WHERE i.scope_id = :s"
        "  AND i.search_tsv @@ to_tsquery('simple', quote_literal(term))) AS df"
        " FROM unnest(CAST(:terms AS text[])) AS term"
        " UNION ALL SELECT NULL, (SELECT count(*) FROM images WHERE scope_id = :s)"
    )
    with engine.connect() as conn:
        rows = conn.execute(sql, {"s": scope_id, "terms": list(terms)}).all()
    df = {r.term: int(r.df) for r in rows if r.term is not None}
    n = next(int(r.df) for r in rows if r.term is None)
    return df, n


def text_coverage(engine: Engine, scope_id: str, *, model: str) -> dict[str, int]:
    """How many images of the scope have a current text embedding for ``model``."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM images WHERE scope_id = :s) AS total, "
                "(SELECT count(DISTINCT i.id) FROM images i JOIN text_embeddings t "
                "  ON t.scope_id = i.scope_id AND t.image_id = i.id AND t.image_sha256 = i.sha256 "
                "  AND t.metadata_hash = i.metadata_hash AND t.model = :m AND t.status = 'ready' "
                "  WHERE i.scope_id = :s) AS ready"
            ),
            {"s": scope_id, "m": model},
        ).one()
    return {"ready": int(row.ready), "total": int(row.total)}


def lexical_coverage(engine: Engine, scope_id: str) -> dict[str, int]:
    """How many images of the scope have lexical text (a current context or a display name)."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT count(*) AS total, count(*) FILTER (WHERE search_tsv <> ''::tsvector) AS ready"
                " FROM images WHERE scope_id = :s"
            ),
            {"s": scope_id},
        ).one()
    return {"ready": int(row.ready), "total": int(row.total)}
