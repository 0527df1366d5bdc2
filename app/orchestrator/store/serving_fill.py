"""Which embeddings the search serving states need (migration 0017): the validity fragments the
planner adds for a scope in a model change, the fill batches' page scans, the current models of an
image, and the rows a replaced model leaves prunable. Read-only statements."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.db.jsoncodec import dumps
from app.orchestrator.store._sql import sql
from app.orchestrator.store.serving import NEEDS

#: Validity of the text stage (app/orchestrator/planner.py) during a model change: besides the job's own
#: model, an image needs a current embedding of its scope's serving and target text models, so uploads
#: and context edits in a backfill are embedded with both (format with scope, image, sha, mh).
SERVING_TEXT_MISSING = (
    "EXISTS (SELECT 1 FROM search_serving ss CROSS JOIN LATERAL (VALUES (ss.serving_model, ss.serving_dims),"
    " (ss.target_model, ss.target_dims)) AS w(model, dims) WHERE ss.scope_id = {scope} AND ss.kind = 'text'"
    " AND w.model IS NOT NULL AND NOT EXISTS (SELECT 1 FROM text_embeddings x2 WHERE x2.scope_id = {scope}"
    " AND x2.image_id = {image} AND x2.image_sha256 = {sha} AND x2.metadata_hash = {mh} AND x2.status = 'ready'"
    " AND x2.model = w.model AND x2.dims = w.dims))"
)

#: The same for the visual stage (format with scope, image, sha): the scope's serving and target visual
#: models, each with its preprocess version.
SERVING_VISUAL_MISSING = (
    "EXISTS (SELECT 1 FROM search_serving ss CROSS JOIN LATERAL (VALUES (ss.serving_model, ss.serving_dims,"
    " ss.serving_ref->>'preprocess_version'), (ss.target_model, ss.target_dims, ss.target_ref->>'preprocess_version'))"
    " AS w(model, dims, pv) WHERE ss.scope_id = {scope} AND ss.kind = 'visual' AND w.model IS NOT NULL"
    " AND NOT EXISTS (SELECT 1 FROM visual_embeddings v2 WHERE v2.scope_id = {scope} AND v2.image_id = {image}"
    " AND v2.image_sha256 = {sha} AND v2.model = w.model AND v2.preprocess_version = w.pv AND v2.dims = w.dims))"
)


def fill_kind(models: list[dict[str, Any]]) -> str:
    """The kind of a fill batch's models (one kind per batch; entries without one are text)."""
    return str(models[0].get("kind", "text")) if models else "text"


# An image whose latest job failed with ``provider_config_mismatch`` (a worker on another
# configuration claimed it, before such jobs were replanned — app/orchestrator/replan.py) may have
# no context at all; a fill seeds it too, so a model change processes it instead of skipping it.
_CONFIG_MISMATCH_FAILED = (
    "coalesce((SELECT j.status = 'failed' AND j.error->>'code' = 'provider_config_mismatch' FROM processing_jobs j"
    " WHERE j.scope_id = i.scope_id AND j.image_id = i.id ORDER BY j.revision DESC LIMIT 1), false)"
)


# The fill scans, one statement per kind: an image needs filling when it needs an embedding of the
# kind (serving.NEEDS) and lacks a current one (serving.CURRENT) of one of the fill models
# (``:models``: a JSON list of {model, dims, pv}).
COUNT_NEEDING_FILL_TEXT = sql("""
SELECT count(*) FROM images i WHERE i.scope_id = :s AND i.created_at <= :u
  AND (""" + NEEDS["text"] + """ OR """ + _CONFIG_MISMATCH_FAILED + """)
  AND EXISTS (SELECT 1 FROM jsonb_to_recordset(CAST(:models AS jsonb)) AS fm(model text, dims int, pv text)
              WHERE NOT EXISTS (SELECT 1 FROM text_embeddings t WHERE t.scope_id = i.scope_id AND t.image_id = i.id
                                AND t.image_sha256 = i.sha256 AND t.metadata_hash = i.metadata_hash
                                AND t.status = 'ready' AND t.model = fm.model AND t.dims = fm.dims))
""")

COUNT_NEEDING_FILL_VISUAL = sql("""
SELECT count(*) FROM images i WHERE i.scope_id = :s AND i.created_at <= :u
  AND (""" + NEEDS["visual"] + """ OR """ + _CONFIG_MISMATCH_FAILED + """)
  AND EXISTS (SELECT 1 FROM jsonb_to_recordset(CAST(:models AS jsonb)) AS fm(model text, dims int, pv text)
              WHERE NOT EXISTS (SELECT 1 FROM visual_embeddings v WHERE v.scope_id = i.scope_id AND v.image_id = i.id
                                AND v.image_sha256 = i.sha256 AND v.model = fm.model AND v.dims = fm.dims
                                AND v.preprocess_version = fm.pv))
""")
COUNT_NEEDING_FILL = {"text": COUNT_NEEDING_FILL_TEXT, "visual": COUNT_NEEDING_FILL_VISUAL}


def count_needing_fill_txn(conn: Connection, scope_id: str, models: list[dict[str, Any]], until: datetime) -> int:
    """How many of the scope's images (created by ``until``) a fill batch of ``models`` must embed."""
    return conn.execute(
        COUNT_NEEDING_FILL[fill_kind(models)], {"s": scope_id, "u": until, "models": _models_doc(models)},
    ).scalar_one()


# Whether the image ``i`` needs filling, per kind: what a fill page reads of each image it scans, and
# reads again of an image once the seeder holds it locked (``needs_fill_txn``).
_NEEDS_FILL_TEXT = """((""" + NEEDS["text"] + """ OR """ + _CONFIG_MISMATCH_FAILED + """)
        AND EXISTS (SELECT 1 FROM jsonb_to_recordset(CAST(:models AS jsonb)) AS fm(model text, dims int, pv text)
                    WHERE NOT EXISTS (SELECT 1 FROM text_embeddings t WHERE t.scope_id = i.scope_id
                                      AND t.image_id = i.id AND t.image_sha256 = i.sha256
                                      AND t.metadata_hash = i.metadata_hash AND t.status = 'ready'
                                      AND t.model = fm.model AND t.dims = fm.dims)))"""
_NEEDS_FILL_VISUAL = """((""" + NEEDS["visual"] + """ OR """ + _CONFIG_MISMATCH_FAILED + """)
        AND EXISTS (SELECT 1 FROM jsonb_to_recordset(CAST(:models AS jsonb)) AS fm(model text, dims int, pv text)
                    WHERE NOT EXISTS (SELECT 1 FROM visual_embeddings v WHERE v.scope_id = i.scope_id
                                      AND v.image_id = i.id AND v.image_sha256 = i.sha256
                                      AND v.model = fm.model AND v.dims = fm.dims
                                      AND v.preprocess_version = fm.pv)))"""

FILL_PAGE_TEXT = sql("""
SELECT i.id, i.created_at, coalesce(i.context_provenance->>'reverse_image_policy', 'forbid') AS policy,
       """ + _NEEDS_FILL_TEXT + """ AS needs
FROM images i WHERE i.scope_id = :s
  AND i.created_at <= :u AND (CAST(:ac AS timestamptz) IS NULL OR (i.created_at, i.id) > (:ac, :aid))
ORDER BY i.created_at, i.id LIMIT :n
""")

FILL_PAGE_VISUAL = sql("""
SELECT i.id, i.created_at, coalesce(i.context_provenance->>'reverse_image_policy', 'forbid') AS policy,
       """ + _NEEDS_FILL_VISUAL + """ AS needs
FROM images i WHERE i.scope_id = :s
  AND i.created_at <= :u AND (CAST(:ac AS timestamptz) IS NULL OR (i.created_at, i.id) > (:ac, :aid))
ORDER BY i.created_at, i.id LIMIT :n
""")
FILL_PAGE = {"text": FILL_PAGE_TEXT, "visual": FILL_PAGE_VISUAL}

NEEDS_FILL_TEXT = sql("SELECT " + _NEEDS_FILL_TEXT + " FROM images i WHERE i.scope_id = :s AND i.id = :id")
NEEDS_FILL_VISUAL = sql("SELECT " + _NEEDS_FILL_VISUAL + " FROM images i WHERE i.scope_id = :s AND i.id = :id")
NEEDS_FILL = {"text": NEEDS_FILL_TEXT, "visual": NEEDS_FILL_VISUAL}


def fill_page_txn(
    conn: Connection, scope_id: str, models: list[dict[str, Any]], until: datetime,
    after: tuple[datetime, uuid.UUID] | None, n: int,
) -> tuple[list[RowMapping], tuple[datetime, uuid.UUID] | None]:
    """The next images (keyset over (created_at, id), up to ``n`` scanned) lacking a current
    embedding of one of ``models``, each with the reverse_image_policy its context was made with;
    and the keyset position reached (None: the scan is done)."""
    rows = conn.execute(
        FILL_PAGE[fill_kind(models)],
        {"s": scope_id, "u": until, "ac": after[0] if after else None, "aid": after[1] if after else None,
         "n": n, "models": _models_doc(models)},
    ).mappings().all()
    position = (rows[-1]["created_at"], rows[-1]["id"]) if len(rows) == n else None
    return [r for r in rows if r["needs"]], position


def needs_fill_txn(conn: Connection, scope_id: str, image_id: uuid.UUID, models: list[dict[str, Any]]) -> bool:
    """Whether the image still needs a fill of ``models``, read with its row locked by the caller.

    The page scan read it before that lock: meanwhile its own job may have ended — a visual fill
    seeds an image whose agent is under way, and once that agent failed an explicit fill job would
    run it again (a paid call a model change never makes) — or embedded it."""
    return bool(conn.execute(
        NEEDS_FILL[fill_kind(models)], {"s": scope_id, "id": image_id, "models": _models_doc(models)},
    ).scalar())


def _models_doc(models: list[dict[str, Any]]) -> str:
    return dumps([{"model": m["model"], "dims": int(m["dims"]), "pv": m.get("preprocess_version")}
                       for m in models])


# Retention hook: a text embedding is *superseded by a model change* —
# prunable — when its model is none of its scope's serving, target or previous model; the previous
# one is kept for a rollback until :keep_after passed its switch (and always while the scope is
# pinned: after a rollback it is the configured model, still written). Scopes without a serving row
# are left alone (nothing is known about them yet). Rows of old image versions are another matter
# (their model may be current): this predicate says nothing about them.
PRUNABLE_TEXT_EMBEDDINGS = sql("""
SELECT te.id FROM text_embeddings te
WHERE EXISTS (SELECT 1 FROM search_serving ss WHERE ss.scope_id = te.scope_id AND ss.kind = 'text'
              AND te.model IS DISTINCT FROM ss.serving_model AND te.model IS DISTINCT FROM ss.target_model
              AND (te.model IS DISTINCT FROM ss.previous_model
                   OR (ss.state <> 'pinned' AND ss.switched_at < :keep_after)))
ORDER BY te.id LIMIT :n FOR UPDATE OF te SKIP LOCKED
""")


def prunable_text_embeddings_txn(conn: Connection, keep_after: datetime, limit: int) -> list[int]:
    """Ids of up to ``limit`` text embeddings superseded by a model change,
    locked ``SKIP LOCKED`` for the caller's delete — the hook the retention sweep uses."""
    return list(conn.execute(
        PRUNABLE_TEXT_EMBEDDINGS, {"keep_after": keep_after, "n": limit},
    ).scalars())


def current_text_models_many_txn(conn: Connection, image_ids: list[uuid.UUID]) -> dict[uuid.UUID, set[tuple[str, int]]]:
    """(model, dims) of every current text embedding of each image (its bytes and context as now)."""
    rows = conn.execute(
        sql(
            "SELECT i.id, t.model, t.dims FROM images i JOIN text_embeddings t ON t.scope_id = i.scope_id"
            " AND t.image_id = i.id AND t.image_sha256 = i.sha256 AND t.metadata_hash = i.metadata_hash"
            " AND t.status = 'ready' WHERE i.id = ANY(:ids)"
        ),
        {"ids": list(image_ids)},
    ).all()
    out: dict[uuid.UUID, set[tuple[str, int]]] = {}
    for image_id, model, dims in rows:
        out.setdefault(image_id, set()).add((model, int(dims)))
    return out


def current_visual_models_many_txn(
    conn: Connection, image_ids: list[uuid.UUID]
) -> dict[uuid.UUID, set[tuple[str, int, str]]]:
    """(model, dims, preprocess_version) of every current visual embedding of each image."""
    rows = conn.execute(
        sql(
            "SELECT i.id, v.model, v.dims, v.preprocess_version FROM images i JOIN visual_embeddings v"
            " ON v.scope_id = i.scope_id AND v.image_id = i.id AND v.image_sha256 = i.sha256 WHERE i.id = ANY(:ids)"
        ),
        {"ids": list(image_ids)},
    ).all()
    out: dict[uuid.UUID, set[tuple[str, int, str]]] = {}
    for image_id, model, dims, pv in rows:
        out.setdefault(image_id, set()).add((model, int(dims), pv))
    return out


# Visual retention hook, as PRUNABLE_TEXT_EMBEDDINGS (a model is (model, dims, preprocess version)).
PRUNABLE_VISUAL_EMBEDDINGS = sql("""
SELECT ve.scope_id, ve.image_id, ve.model, ve.preprocess_version, ve.image_sha256 FROM visual_embeddings ve
WHERE EXISTS (SELECT 1 FROM search_serving ss WHERE ss.scope_id = ve.scope_id AND ss.kind = 'visual'
              AND (ve.model, ve.dims, ve.preprocess_version) IS DISTINCT FROM
                  (ss.serving_model, ss.serving_dims, ss.serving_ref->>'preprocess_version')
              AND (ve.model, ve.dims, ve.preprocess_version) IS DISTINCT FROM
                  (ss.target_model, ss.target_dims, ss.target_ref->>'preprocess_version')
              AND ((ve.model, ve.dims, ve.preprocess_version) IS DISTINCT FROM
                   (ss.previous_model, ss.previous_dims, ss.previous_ref->>'preprocess_version')
                   OR (ss.state <> 'pinned' AND ss.switched_at < :keep_after)))
LIMIT :n FOR UPDATE OF ve SKIP LOCKED
""")


def prunable_visual_embeddings_txn(conn: Connection, keep_after: datetime, limit: int) -> list[tuple]:
    """Keys (scope_id, image_id, model, preprocess_version, image_sha256) of up to ``limit`` visual
    embeddings superseded by a model change, locked SKIP LOCKED for the caller's DELETE."""
    return [tuple(r) for r in conn.execute(PRUNABLE_VISUAL_EMBEDDINGS, {"keep_after": keep_after, "n": limit})]
