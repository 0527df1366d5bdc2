"""A batched claim whose hinted task stays locked past ``lock_timeout`` (a writer joining its
wake-up group, a batch page being seeded on a loaded box) claims nothing, raises nothing and
hands back a hint for the same task — the task is claimed by that hint once the holder commits."""

from __future__ import annotations

from sqlalchemy import event, text

from app.db.engine import make_engine
from app.orchestrator import Orchestrator
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task


def test_a_hinted_task_locked_past_lock_timeout_is_hinted_again_not_failed(db_url, engine, settings):
    orch = Orchestrator(engine, settings)
    task_id = visual_task(store_and_ingest(orch, "local", png_bytes(31))).task_id

    impatient = make_engine(db_url, pool_size=1, max_overflow=0)

    @event.listens_for(impatient, "connect")
    def _short_lock_timeout(dbapi_conn, _record):
        with dbapi_conn.cursor() as cur:
            cur.execute("SET lock_timeout = '200ms'")

    worker = Orchestrator(impatient, settings)
    try:
        with engine.connect() as holder:
            holder.execute(text("SELECT id FROM tasks WHERE id = :id FOR NO KEY UPDATE"), {"id": task_id})
            stalled = worker.claim_with_batch(task_id, "visual", 16, "w1")
            assert stalled.claims == [] and [h.task_id for h in stalled.hints] == [task_id]
            holder.rollback()
        with engine.connect() as c:
            assert c.execute(text("SELECT status FROM tasks WHERE id = :id"), {"id": task_id}).scalar() == "queued"
        again = worker.claim_with_batch(stalled.hints[0].task_id, "visual", 16, "w1")
        assert [c.task_id for c in again.claims] == [task_id] and again.hints == []
    finally:
        impatient.dispose()
