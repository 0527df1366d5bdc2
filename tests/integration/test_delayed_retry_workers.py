"""A retried task runs when its backoff ends (docs/architecture.md "Delayed hints"), under a real
Celery worker and no sweep at all: the retry's hint goes out with a Celery ``eta`` and the worker
that receives it claims the task once it is due. Before, the requeue cleared the hint and nothing
woke the task but the sweep (here every hour, and no beat runs), so the job never finished."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator
from tests.conftest import poll_until
from tests.integration.conftest import ingest
from tests.integration.fakes import read_calls

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("local_hints", ["8", "0"])
def test_a_retried_task_runs_when_its_backoff_ends_without_any_sweep(engine, it_settings, cluster, publisher,
                                                                    call_log, local_hints):
    settings = it_settings.replace(
        visual_provider="tests.integration.fakes:FlakyVisual", sweep_interval_s=3600.0, rehint_grace_s=3600.0,
        backoff_base_s=1.0, backoff_max_s=1.0,
    )
    cluster.settings = settings
    orch = Orchestrator(engine, settings)
    # one worker of every lane: with local continuation on, the retry's hint must still reach the broker
    cluster.worker("visual", "agent", "embedding", MEMEFLOW_WORKER_LOCAL_HINTS=local_hints)
    res = ingest(orch, settings, 1)
    publisher.publish(res.hints)

    def finished():
        job = orch.get_job("local", res.job["id"])
        return job if job["status"] not in ("queued", "running") else None

    # the deadline is generous for a loaded box; without the delayed hint nothing finishes in it
    job = poll_until(finished, timeout=60, interval=0.1, what="the job finished")
    assert job["status"] == "succeeded", job
    assert [stage for stage, _ in read_calls(call_log) if stage.startswith("visual")] == ["visual-failed", "visual"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT status, attempt_count FROM tasks WHERE lane = 'visual'")).all() == [
            ("succeeded", 2)]
