"""Stage artifacts: visual and text embeddings (written only by fenced completions)."""

from __future__ import annotations

import json
import uuid

from sqlalchemy.engine import Connection

from app.orchestrator.store._sql import sql

# The image's current visual embedding of the job's model exists — and (during a model change, see
# serving_fill.SERVING_VISUAL_MISSING) one of each of its scope's serving and target visual models.
VISUAL_EXISTS = sql("""
SELECT EXISTS (SELECT 1 FROM visual_embeddings WHERE scope_id = :s AND image_id = :i
               AND image_sha256 = :sha AND model = :m AND preprocess_version = :pv AND dims = :d)
   AND NOT EXISTS (SELECT 1 FROM search_serving ss CROSS JOIN LATERAL (VALUES (ss.serving_model, ss.serving_dims,
                   ss.serving_ref->>'preprocess_version'), (ss.target_model, ss.target_dims,
                   ss.target_ref->>'preprocess_version')) AS w(model, dims, pv)
                   WHERE ss.scope_id = :s AND ss.kind = 'visual' AND w.model IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM visual_embeddings v2 WHERE v2.scope_id = :s AND v2.image_id = :i
                   AND v2.image_sha256 = :sha AND v2.model = w.model AND v2.preprocess_version = w.pv
                   AND v2.dims = w.dims))
""")


def visual_exists_txn(conn: Connection, scope_id: str, image_id: uuid.UUID, sha256: str, config: dict) -> bool:
    """Whether the image's visual stage output is valid (VISUAL_EXISTS)."""
    return conn.execute(
        VISUAL_EXISTS,
        {"s": scope_id, "i": image_id, "sha": sha256, "m": config["model"], "pv": config["preprocess_version"],
         "d": int(config["dims"])},
    ).scalar_one()


# The image's current text embedding (its bytes and context as now) of the job's model exists — and
# (serving_fill.SERVING_TEXT_MISSING) one of each of its scope's serving and target text models.
TEXT_EXISTS = sql("""
SELECT EXISTS (SELECT 1 FROM text_embeddings WHERE scope_id = :s AND image_id = :i
               AND image_sha256 = :sha AND metadata_hash = :mh AND model = :m AND dims = :d AND status = 'ready')
   AND NOT EXISTS (SELECT 1 FROM search_serving ss CROSS JOIN LATERAL (VALUES (ss.serving_model, ss.serving_dims),
                   (ss.target_model, ss.target_dims)) AS w(model, dims)
                   WHERE ss.scope_id = :s AND ss.kind = 'text' AND w.model IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM text_embeddings x2 WHERE x2.scope_id = :s AND x2.image_id = :i
                   AND x2.image_sha256 = :sha AND x2.metadata_hash = :mh AND x2.status = 'ready'
                   AND x2.model = w.model AND x2.dims = w.dims))
""")


def text_exists_txn(
    conn: Connection, scope_id: str, image_id: uuid.UUID, sha256: str, metadata_hash: str | None, config: dict
) -> bool:
    """Whether the image's text stage output is valid (TEXT_EXISTS; never without a context)."""
    if metadata_hash is None:
        return False
    return conn.execute(
        TEXT_EXISTS,
        {"s": scope_id, "i": image_id, "sha": sha256, "mh": metadata_hash, "m": config["model"],
         "d": int(config["dims"])},
    ).scalar_one()


def insert_visual_many_txn(conn: Connection, rows: list[dict]) -> None:
    """Visual embeddings of several images, one statement. ``rows``: scope_id, image_id, sha, model,
    preprocess_version, dims, vector, task_id."""
    if rows:
        conn.execute(
            sql(
                "INSERT INTO visual_embeddings (scope_id, image_id, image_sha256, model, preprocess_version, dims,"
                " embedding, task_id)"
                " SELECT scope_id, image_id, sha, model, preprocess_version, dims, CAST(v AS vector), task_id"
                " FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(scope_id text, image_id uuid, sha text,"
                "  model text, preprocess_version text, dims int, v text, task_id uuid) ORDER BY image_id"
                " ON CONFLICT (scope_id, image_id, model, preprocess_version, image_sha256) DO NOTHING"
            ),
            {"rows": _doc(rows)},
        )


def insert_text_many_txn(conn: Connection, rows: list[dict]) -> None:
    """Text embeddings of several images, one statement. ``rows``: scope_id, image_id, sha,
    metadata_hash, model, dims, document_version, document, vector, task_id."""
    if rows:
        conn.execute(
            sql(
                "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims,"
                " document_version, document, embedding, status, task_id)"
                " SELECT scope_id, image_id, sha, metadata_hash, model, dims, document_version, document,"
                " CAST(v AS vector), 'ready', task_id"
                " FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(scope_id text, image_id uuid, sha text,"
                "  metadata_hash text, model text, dims int, document_version text, document text, v text,"
                "  task_id uuid) ORDER BY image_id"
                " ON CONFLICT (scope_id, image_id, image_sha256, metadata_hash, model) DO NOTHING"
            ),
            {"rows": _doc(rows)},
        )


def _doc(rows: list[dict]) -> str:
    return json.dumps([{**{k: v for k, v in r.items() if k != "vector"}, "v": _vec(r["vector"])} for r in rows],
                      default=str)


def _vec(vector: list[float]) -> str:
    """pgvector's text form; json.dumps renders a list of floats in C (repr of each, as pgvector reads them)."""
    try:
        return json.dumps(vector)
    except TypeError:  # numpy scalars that are not float subclasses (float32)
        return json.dumps([float(x) for x in vector])
