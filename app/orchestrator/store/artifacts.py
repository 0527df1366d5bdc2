"""Stage artifacts: visual and text embeddings (written only by fenced completions)."""

from __future__ import annotations

import json
import uuid

from sqlalchemy.engine import Connection

from app.orchestrator.store._sql import sql
from app.orchestrator.store.serving_fill import SERVING_TEXT_MISSING, SERVING_VISUAL_MISSING


def visual_exists_txn(conn: Connection, scope_id: str, image_id: uuid.UUID, sha256: str, config: dict) -> bool:
    return conn.execute(
        sql(
            "SELECT EXISTS (SELECT 1 FROM visual_embeddings WHERE scope_id = :s AND image_id = :i"
            " AND image_sha256 = :sha AND model = :m AND preprocess_version = :pv AND dims = :d)"
            f" AND NOT {SERVING_VISUAL_MISSING.format(scope=':s', image=':i', sha=':sha')}"
        ),
        {"s": scope_id, "i": image_id, "sha": sha256, "m": config["model"], "pv": config["preprocess_version"],
         "d": int(config["dims"])},
    ).scalar_one()


def text_exists_txn(
    conn: Connection, scope_id: str, image_id: uuid.UUID, sha256: str, metadata_hash: str | None, config: dict
) -> bool:
    if metadata_hash is None:
        return False
    return conn.execute(
        sql(
            "SELECT EXISTS (SELECT 1 FROM text_embeddings WHERE scope_id = :s AND image_id = :i"
            " AND image_sha256 = :sha AND metadata_hash = :mh AND model = :m AND dims = :d AND status = 'ready')"
            f" AND NOT {SERVING_TEXT_MISSING.format(scope=':s', image=':i', sha=':sha', mh=':mh')}"
        ),
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
