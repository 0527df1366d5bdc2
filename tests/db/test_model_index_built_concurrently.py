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


def test_a_completion_landing_a_new_models_first_vector_does_not_wait_for_its_index(engine, settings):
    """The build first waits for every older transaction that writes the table. Inline, the
    completion that landed the first vector of a new model waited with it — up to the lock timeout,
    and a long build held its claims past their lease. Now the completion commits at once, and the
    build (in a thread of the worker, waiting without a lock timeout) finishes once the older
    transaction has."""
    from app.orchestrator import RecordingPublisher
    from app.orchestrator import service as service_mod
    from app.stages.providers import Providers
    from app.worker.run import handle_hint
    from tests.support.pipeline import png_bytes, store_and_ingest, visual_task

    name = vector_index_name("visual_embeddings", "deterministic-v1", 64)
    with engine.begin() as conn:
        conn.execute(text(f'DROP INDEX IF EXISTS "{name}"'))
    with service_mod._INDEX_LOCK:  # this process has not seen the model's index yet
        service_mod._INDEXED.clear()
        service_mod._INDEX_RETRY_AT.clear()
    orch = Orchestrator(engine, settings)
    hint = visual_task(store_and_ingest(orch, "local", png_bytes(40)))
    older = engine.connect()  # another completion's open transaction on the table
    older.execute(text("LOCK TABLE visual_embeddings IN ROW EXCLUSIVE MODE"))
    claimed: list[int] = []
    worker = threading.Thread(target=lambda: claimed.append(
        handle_hint(orch, "visual", hint.task_id, "w1", Providers(settings), RecordingPublisher())))
    try:
        worker.start()

        def landed() -> bool:
            with engine.connect() as conn:
                return bool(conn.execute(text("SELECT count(*) FROM visual_embeddings")).scalar())

        poll_until(landed, timeout=30, what="the completion to commit its vector")
        with engine.connect() as watch:  # the build is still there, waiting for the older transaction
            assert watch.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'CREATE INDEX CONCURRENTLY%'"
                " AND wait_event_type = 'Lock'")).scalar() == 1
    finally:
        older.commit()
        older.close()
        worker.join(timeout=30)
    assert claimed == [1]
    poll_until(lambda: _valid(engine, name) is True, timeout=30, what="the index built in the background")
