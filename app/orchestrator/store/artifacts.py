"""Stage artifacts: visual and text embeddings (written only by fenced completions; whether they
exist is each stage's ``exists_sql``, read by store/facts.py)."""

from __future__ import annotations

import orjson
from sqlalchemy.engine import Connection

from app.db.jsoncodec import dumps
from app.orchestrator.store._sql import sql


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


#: One row per (image version, model): a row of another ``document_version`` (the context rendered
#: another way, the text stage's fingerprint changed) is replaced by the new rendering; one of the same
#: rendering is kept. DISTINCT ON: ON CONFLICT DO UPDATE may touch a row once per statement.
INSERT_TEXT_MANY = sql(
    "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims,"
    " document_version, document, embedding, status, task_id)"
    " SELECT DISTINCT ON (image_id, sha, metadata_hash, model) scope_id, image_id, sha, metadata_hash, model, dims,"
    " document_version, document, CAST(v AS vector), 'ready', task_id"
    " FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(scope_id text, image_id uuid, sha text,"
    "  metadata_hash text, model text, dims int, document_version text, document text, v text,"
    "  task_id uuid) ORDER BY image_id, sha, metadata_hash, model"
    " ON CONFLICT (scope_id, image_id, image_sha256, metadata_hash, model) DO UPDATE"
    " SET dims = excluded.dims, document_version = excluded.document_version, document = excluded.document,"
    " embedding = excluded.embedding, status = excluded.status, task_id = excluded.task_id, created_at = now()"
    " WHERE text_embeddings.document_version IS DISTINCT FROM excluded.document_version"
)


def insert_text_many_txn(conn: Connection, rows: list[dict]) -> None:
    """Text embeddings of several images, one statement. ``rows``: scope_id, image_id, sha,
    metadata_hash, model, dims, document_version, document, vector, task_id."""
    if rows:
        conn.execute(INSERT_TEXT_MANY, {"rows": _doc(rows)})


def _doc(rows: list[dict]) -> str:
    return dumps([{**{k: v for k, v in r.items() if k != "vector"}, "v": _vec(r["vector"])} for r in rows])


def _vec(vector: list[float]) -> str:
    """pgvector's text form: a JSON list of the floats, rendered in C by orjson (each float's shortest
    round-trip form, as ``repr`` gives it, which pgvector reads the same)."""
    if type(vector) is list and all(type(x) is float for x in vector):
        return orjson.dumps(vector).decode()
    return orjson.dumps([float(x) for x in vector]).decode()  # numpy scalars, ints, a tuple …
