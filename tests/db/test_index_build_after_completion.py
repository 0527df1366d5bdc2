"""The first vector of a model builds its per-model HNSW index (``Orchestrator.ensure_vector_index``,
``CREATE INDEX CONCURRENTLY``: on a big table, minutes). The worker's batch must not wait for that
build holding its claims: its heartbeat has stopped by then (the terminal write comes after it), so
the leases lapse during the build, the sweep hands the tasks to another worker, and the first
worker's results — computed, not yet written — are fenced out when the build ends. The completion
commits first; the build follows, holding nothing."""

from __future__ import annotations

import threading

from sqlalchemy import text

from app.db.engine import vector_index_name
from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.conftest import poll_until
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task


def _scalar(engine, sql, **params):
    with engine.connect() as c:
        return c.execute(text(sql), params).scalar()


def _build_waits(engine) -> bool:
    return bool(_scalar(engine, "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'CREATE INDEX CONCURRENTLY%'"
                                " AND wait_event_type = 'Lock'"))


def test_a_batch_completes_before_its_models_index_build_and_keeps_no_claim_during_it(engine, settings):
    orch = Orchestrator(engine, settings)
    model, dims = orch.stage_configs.visual["model"], int(orch.stage_configs.visual["dims"])
    hints = [visual_task(store_and_ingest(orch, "local", png_bytes(seed))) for seed in (8100, 8101)]
    # a long transaction the build must wait for (as it waits for a big table's scan)
    holder = engine.connect()
    holder.execute(text("LOCK TABLE visual_embeddings IN SHARE UPDATE EXCLUSIVE MODE"))
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            handle_hint(orch, "visual", hints[0].task_id, "w1", Providers(settings), RecordingPublisher())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        poll_until(lambda: _build_waits(engine), timeout=30, what="the index build waiting")
        # while the build waits, the batch is already written: no claim of it is left to lapse
        statuses = _scalar(engine, "SELECT array_agg(status ORDER BY id) FROM tasks WHERE lane = 'visual'")
        assert statuses == ["succeeded", "succeeded"]
        assert _scalar(engine, "SELECT count(*) FROM visual_embeddings") == 2
    finally:
        holder.rollback()
        holder.close()
        thread.join(timeout=30)
    assert not thread.is_alive() and errors == []
    assert _scalar(engine, "SELECT coalesce(sum(count), 0) FROM ops_counters WHERE name = 'fencing_rejection'") == 0
    valid = _scalar(engine, "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(:n)",
                    n=vector_index_name("visual_embeddings", model, dims))
    assert valid is True
