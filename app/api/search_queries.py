"""Read-only pgvector queries for visual search, shaped to use the per-model HNSW expression indexes
(text search: app/search/queries.py).

Only *current* embeddings count: the row's image_sha256 must equal the image's sha256. ``dims`` is formatted into the SQL as an
integer literal because the index expression is ``embedding::vector(<dims>)``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, text

from app.db.engine import scope_vector_index_name
from app.search.queries import IMAGE_COLUMNS, LATEST_JOB, cached_count, exact_scan, iterative_scan, vector_literal


def _hits(rows: Any) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        m = dict(r._mapping)
        score = float(m.pop("score"))
        out.append({"image": m, "score": score})
    # relaxed_order iterative scans may return neighbours slightly out of order
    out.sort(key=lambda h: h["score"], reverse=True)
    return out


def visual_coverage(engine: Engine, scope_id: str, *, model: str, preprocess_version: str) -> dict[str, int]:
    """How many images of the scope have a current visual embedding of the model (``cached_count``)."""
    return cached_count(engine, scope_id, ("visual", model, preprocess_version),
                        lambda: _visual_coverage(engine, scope_id, model=model, preprocess_version=preprocess_version))


def _visual_coverage(engine: Engine, scope_id: str, *, model: str, preprocess_version: str) -> dict[str, int]:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM images WHERE scope_id = :s) AS total, "
                "(SELECT count(DISTINCT i.id) FROM images i JOIN visual_embeddings v "
                "  ON v.scope_id = i.scope_id AND v.image_id = i.id AND v.image_sha256 = i.sha256 "
                "  AND v.model = :m AND v.preprocess_version = :p WHERE i.scope_id = :s) AS ready"
            ),
            {"s": scope_id, "m": model, "p": preprocess_version},
        ).one()
    return {"ready": int(row.ready), "total": int(row.total)}


def current_visual_vector(
    engine: Engine, scope_id: str, image_id: uuid.UUID, *, model: str, preprocess_version: str, dims: int,
    sha256: str | None = None,
) -> list[float] | None:
    """The current visual embedding of one image of the scope, if it has been computed (``sha256``:
    only while the image still holds those bytes)."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT v.embedding FROM visual_embeddings v JOIN images i "
                " ON i.scope_id = v.scope_id AND i.id = v.image_id AND i.sha256 = v.image_sha256 "
                "WHERE v.scope_id = :s AND v.image_id = :id AND v.model = :m "
                " AND v.preprocess_version = :p AND v.dims = :d"
                " AND (CAST(:sha AS text) IS NULL OR v.image_sha256 = :sha) LIMIT 1"
            ),
            {"s": scope_id, "id": image_id, "m": model, "p": preprocess_version, "d": int(dims), "sha": sha256},
        ).first()
    if row is None:
        return None
    emb = row.embedding
    return [float(x) for x in (emb.to_list() if hasattr(emb, "to_list") else _parse(emb))]


def _parse(value: Any) -> list[float]:
    if isinstance(value, str):
        return [float(x) for x in value.strip("[]").split(",") if x]
    return list(value)


def storage_keys(engine: Engine, scope_id: str, versions: Sequence[tuple[Any, str]]) -> dict[str, str]:
    """Storage keys of some image versions of the scope — (image id, sha256) pairs — by image id.
    An image that is gone or holds other bytes now (replaced since the search read it) is left out:
    its file is not the version the hit names (whose thumbnails are cached under that sha256)."""
    if not versions:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT i.id, i.storage_key FROM images i"
                 " JOIN unnest(CAST(:ids AS uuid[]), CAST(:shas AS text[])) AS v(id, sha)"
                 " ON i.id = v.id AND i.sha256 = v.sha WHERE i.scope_id = :s"),
            {"s": scope_id, "ids": [str(i) for i, _ in versions], "shas": [str(sha) for _, sha in versions]},
        ).all()
    return {str(r.id): str(r.storage_key) for r in rows}


def search_visual(
    engine: Engine,
    scope_id: str,
    *,
    model: str,
    preprocess_version: str,
    dims: int,
    vector: Sequence[float],
    limit: int,
    exclude_image_id: uuid.UUID | None = None,
) -> list[dict]:
    """Nearest current visual embeddings of the scope (score = 1 - cosine distance); a small scope
    by an exact scan (``app.search.queries.exact_scan``)."""
    d = int(dims)
    scoped = (
        "FROM visual_embeddings v "
        "JOIN images i ON i.scope_id = v.scope_id AND i.id = v.image_id AND i.sha256 = v.image_sha256 "
        "WHERE v.scope_id = :s AND v.model = :m AND v.dims = :d AND v.preprocess_version = :p "
        "AND (CAST(:ex AS uuid) IS NULL OR v.image_id <> CAST(:ex AS uuid)) "
    )
    # distances materialized before the sort: no index can serve it, every row of the scope is ranked
    exact_sql = text(
        f"WITH d AS MATERIALIZED (SELECT v.image_id, v.embedding::vector({d}) <=> CAST(:q AS vector({d})) AS dist "
        f"{scoped}), n AS (SELECT image_id, dist FROM d ORDER BY dist, image_id LIMIT :limit) "
        f"SELECT {IMAGE_COLUMNS}, {LATEST_JOB}, 1 - n.dist AS score "
        "FROM n JOIN images i ON i.scope_id = :s AND i.id = n.image_id"
    )
    # HNSW: the image's currency is a per-row filter of the index scan (see CURRENT_TEXT_FILTER)
    sql = text(
        f"WITH n AS MATERIALIZED (SELECT v.image_id, v.embedding::vector({d}) <=> CAST(:q AS vector({d})) AS dist "
        "FROM visual_embeddings v WHERE v.scope_id = :s AND v.model = :m AND v.dims = :d "
        "AND v.preprocess_version = :p AND (CAST(:ex AS uuid) IS NULL OR v.image_id <> CAST(:ex AS uuid)) "
        "AND (SELECT true FROM images i WHERE i.scope_id = v.scope_id AND i.id = v.image_id AND i.sha256 = v.image_sha256) "
        f"ORDER BY v.embedding::vector({d}) <=> CAST(:q AS vector({d})) LIMIT :limit) "
        f"SELECT {IMAGE_COLUMNS}, {LATEST_JOB}, 1 - n.dist AS score "
        "FROM n JOIN images i ON i.scope_id = :s AND i.id = n.image_id"
    )
    params = {
        "s": scope_id, "m": model, "d": d, "p": preprocess_version, "q": vector_literal(vector),
        "limit": limit, "ex": str(exclude_image_id) if exclude_image_id else None,
    }
    with engine.begin() as conn:
        if exact_scan(conn, scope_id, scope_vector_index_name("visual_embeddings", model, dims, scope_id)):
            return _hits(conn.execute(exact_sql, params))
        iterative_scan(conn)
        return _hits(conn.execute(sql, params))
