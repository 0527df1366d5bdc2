"""JOB_FACTS_MANY (app/orchestrator/store/facts.py) — the job lock and facts read of every
advance — runs on a generic plan once psycopg has prepared it, instead of being planned anew on
each call (docs/performance.md §31)."""

from __future__ import annotations

from sqlalchemy import text

from app.db.engine import make_engine
from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from app.worker import run
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task


def test_the_job_facts_read_is_planned_once_per_connection(db_url, settings):
    engine = make_engine(db_url, pool_size=1, max_overflow=0)  # one connection: its prepared statements
    try:
        orch = Orchestrator(engine, settings)
        providers, pub = Providers(settings), RecordingPublisher()
        for seed in range(60, 68):  # each image: ingest, visual, agent and text each advance its job
            pending = [visual_task(store_and_ingest(orch, "local", png_bytes(seed)))]
            while pending:
                hint = pending.pop(0)
                run.handle_hint(orch, hint.lane, hint.task_id, "w0", providers, pub)
                pending.extend(pub.drain())
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM processing_jobs WHERE status = 'succeeded'")).scalar() == 8
            plans = conn.execute(text(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE '%AS stage_rows%'")).all()
        assert len(plans) == 1, plans
        generic, custom = plans[0]
        # PostgreSQL tries five custom plans, then keeps the generic one if it is no dearer
        assert generic >= 10 and custom <= 5, (generic, custom)
    finally:
        engine.dispose()
