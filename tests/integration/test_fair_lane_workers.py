"""The agent lane's DB-wide slots shared fairly by two scopes, under real worker processes, with
the sweep effectively disabled: every free slot must end with a hint for a claimable task (SPEC
§2.7, §4.10; docs/architecture.md "Fairness"). Refusals — for want of a slot, or because the other
scope waits — spend hints all the time here; if any of them left a free slot with no hint, the
jobs behind it would wait for a sweep that does not come, and the deadline below would pass."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.conftest import poll_until
from tests.integration.conftest import ingest, wait_jobs_terminal
from tests.integration.test_celery_runtime import assert_each_stage_once, counting, make_orch

pytestmark = pytest.mark.slow

NO_SWEEP_S = 3600.0  # no beat runs, and a hint is not "lost" before an hour: only the hot paths hint


@pytest.mark.parametrize(("limit", "batch"), [(1, 1), (2, 1), (2, 2)])
def test_two_scopes_sharing_a_small_agent_lane_finish_every_job_without_the_sweep(
    cluster, engine, publisher, call_log, limit, batch
):
    """Both scopes' agent tasks wait with their hints in the broker before any agent worker
    starts; then more agent workers than slots race for them, and completions (of a batch of two,
    with ``batch`` 2) free slots while refused hints keep coming."""
    counting(cluster, agent_lane_limit=limit, agent_batch_size=batch, lease_s=30.0, heartbeat_s=1.0,
             sweep_interval_s=NO_SWEEP_S, rehint_grace_s=NO_SWEEP_S)
    cluster.extra_env.update(MEMEFLOW_AGENT_LANE_LIMIT=str(limit), MEMEFLOW_AGENT_BATCH_SIZE=str(batch))
    orch = make_orch(engine, cluster.settings)
    cluster.worker("visual")
    cluster.worker("embedding")
    n = 24
    job_ids = []
    for i in range(n):  # the two scopes' uploads interleaved
        result = ingest(orch, cluster.settings, 9000 + i, scope="tenant-a" if i % 2 else "tenant-b")
        publisher.publish(result.hints)
        job_ids.append(result.job["id"])
    poll_until(lambda: _count(engine, "SELECT count(*) FROM tasks WHERE lane = 'agent' AND status = 'queued'") == n,
               timeout=60, what=f"{n} agent tasks queued")
    for i in range(limit + 1):  # more agent workers than slots: claims are refused for want of one
        cluster.worker("agent", name=f"agent-{i}", wait=False)

    counts = wait_jobs_terminal(engine, job_ids, timeout=90)

    assert counts == {"succeeded": n}
    assert_each_stage_once(call_log, n)
    assert _count(engine, "SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL") == 0


def _count(engine, sql: str) -> int:
    with engine.connect() as c:
        return c.execute(text(sql)).scalar_one()
