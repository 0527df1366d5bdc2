"""The first vector of a new model (a model change) makes its per-model HNSW index — without
blocking every other tenant's embedding writes while the build scans the whole table."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from app.db.engine import vector_index_name
from app.orchestrator import Orchestrator
from tests.conftest import poll_until

DIMS = 8


def _embedding_row(conn, scope: str, n: int, model: str = "old-model") -> None:
    conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES (:s, gen_random_uuid()) ON CONFLICT DO NOTHING"),
                 {"s": scope})
    conn.execute(text(
        "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
        " metadata_hash) SELECT md5(k)::uuid, :s, md5(k) || md5(k || 'x'), '.png',"
        " 'image/png', 1, 1, 1, 'k', 'h' FROM (SELECT CAST(:k AS text) AS k) x"), {"s": scope, "k": f"{scope}{n}"})
    conn.execute(text(
        "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims, document_version,"
        f" document, embedding) SELECT :s, md5(k)::uuid, md5(k) || md5(k || 'x'), 'h', :m,"
        f" {DIMS}, '1', '', CAST(array_fill(0.5::real, ARRAY[{DIMS}]) AS vector) FROM (SELECT CAST(:k AS text) AS k) x"),
        {"s": scope, "k": f"{scope}{n}", "m": model})


def _valid(engine, name: str):
    with engine.connect() as conn:
        return conn.execute(text("SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(:n)"),
                            {"n": name}).scalar()


def test_building_a_new_models_index_does_not_block_other_embedding_writes(engine, settings):
    orch = Orchestrator(engine, settings)
    with engine.begin() as conn:
        _embedding_row(conn, "s0", 0)
    in_flight = engine.connect()  # another tenant's completion, mid-transaction
    in_flight.execute(text("SELECT 1"))
    _embedding_row(in_flight, "s1", 1)
    errors: list[BaseException] = []

    def first_vector_of_new_model():
        try:
            orch.ensure_vector_index("text_embeddings", "new-model", DIMS)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    builder = threading.Thread(target=first_vector_of_new_model)
    builder.start()

    def build_waits() -> bool:  # a transaction per look: an open one would be waited for too (and
        # pg_stat_activity is read once per transaction)
        with engine.connect() as watch:
            return bool(watch.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'CREATE INDEX CONCURRENTLY%'"
                " AND wait_event_type = 'Lock'")).scalar())

    poll_until(build_waits, timeout=30, what="the index build waiting for the in-flight completion")
    try:
        with engine.begin() as conn:  # a third tenant's completion
            conn.execute(text("SET LOCAL lock_timeout = '1s'"))
            _embedding_row(conn, "s2", 2)
    except OperationalError as exc:
        pytest.fail(f"an embedding write was blocked by the index build: {exc.orig}")
    finally:
        in_flight.commit()
        in_flight.close()
        builder.join(timeout=30)
    assert not builder.is_alive() and errors == []
    assert _valid(engine, vector_index_name("text_embeddings", "new-model", DIMS)) is True
