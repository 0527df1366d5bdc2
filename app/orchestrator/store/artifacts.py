"""Stage artifacts: visual and text embeddings (written only by fenced completions)."""

from __future__ import annotations

import uuid

from sqlalchemy.engine import Connection

from app.orchestrator.store._sql import sql


def visual_exists_txn(conn: Connection, scope_id: str, image_id: uuid.UUID, sha256: str, config: dict) -> bool:
    return conn.execute(
        sql(
            "SELECT EXISTS (SELECT 1 FROM visual_embeddings WHERE scope_id = :s AND image_id = :i"
            " AND image_sha256 = :sha AND model = :m AND preprocess_version = :pv AND dims = :d)"
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
        ),
        {"s": scope_id, "i": image_id, "sha": sha256, "mh": metadata_hash, "m": config["model"],
         "d": int(config["dims"])},
    ).scalar_one()


def insert_visual_txn(
    conn: Connection, scope_id: str, image_id: uuid.UUID, sha256: str, model: str, preprocess_version: str,
    dims: int, vector: list[float], task_id: uuid.UUID,
) -> None:
    conn.execute(
        sql(
            "INSERT INTO visual_embeddings (scope_id, image_id, image_sha256, model, preprocess_version, dims,"
            " embedding, task_id) VALUES (:s, :i, :sha, :m, :pv, :d, CAST(:v AS vector), :t)"
            " ON CONFLICT (scope_id, image_id, model, preprocess_version, image_sha256) DO NOTHING"
        ),
        {"s": scope_id, "i": image_id, "sha": sha256, "m": model, "pv": preprocess_version, "d": dims,
         "v": _vec(vector), "t": task_id},
    )


def insert_text_txn(
    conn: Connection, scope_id: str, image_id: uuid.UUID, sha256: str, metadata_hash: str, model: str,
    dims: int, document_version: str, document: str, vector: list[float], task_id: uuid.UUID,
) -> None:
    conn.execute(
        sql(
            "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims,"
            " document_version, document, embedding, status, task_id)"
            " VALUES (:s, :i, :sha, :mh, :m, :d, :dv, :doc, CAST(:v AS vector), 'ready', :t)"
            " ON CONFLICT (scope_id, image_id, image_sha256, metadata_hash, model) DO NOTHING"
        ),
        {"s": scope_id, "i": image_id, "sha": sha256, "mh": metadata_hash, "m": model, "d": dims,
         "dv": document_version, "doc": document, "v": _vec(vector), "t": task_id},
    )


def _vec(vector: list[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"
