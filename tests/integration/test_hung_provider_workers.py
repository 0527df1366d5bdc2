"""Real Celery workers whose provider call never returns on one image (a model that deadlocks or
loops on one input): the call is cut off after its lane's ``MEMEFLOW_<LANE>_RUN_MAX_S``
(app/worker/watchdog.py) — the heartbeat stops extending the claim, the worker process ends with
``STAGE_TIMEOUT_EXIT`` — and the existing recovery takes over (docs/architecture.md "A provider call
that never returns"):

- a visual model hanging on one image of a batch of two scopes, in a ``solo`` worker (restarted
  as its supervisor would) and in a ``prefork`` one (whose pool replaces the child itself): the
  image ends ``failed`` (``max_attempts_exceeded``) after hanging alone, its batch-mates succeed;
- a recall-safe local agent hanging on one image in a threads-pool worker: the same, and the
  images beside it succeed uncharged;
- an agent that is not recall-safe (a paid call, as far as memeflow knows) hanging: the job ends
  ``unknown_execution`` and the call is never made twice.

Every wait is bounded: on code without the watchdog these tests fail at their deadline instead
of hanging."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator
from app.worker.watchdog import STAGE_TIMEOUT_EXIT
from tests.conftest import poll_until
from tests.integration.conftest import Sweeper
from tests.support import poison
from tests.support.pipeline import png_bytes, store_and_ingest

pytestmark = pytest.mark.slow

MAX_ATTEMPTS = 2
RUN_MAX_S = "2"
DEADLINE_S = 120


def _no_active_jobs(engine) -> bool:
    with engine.connect() as c:
        return not c.execute(text("SELECT 1 FROM processing_jobs WHERE status IN ('queued', 'running')")).first()


def _lane_rows(engine, lane: str):
    with engine.connect() as c:
        return [dict(r) for r in c.execute(text(
            "SELECT t.scope_id, i.width, t.status, t.attempt_count, t.error->>'code' AS code, j.status AS job"
            " FROM tasks t JOIN images i ON i.id = t.image_id JOIN processing_jobs j ON j.id = t.job_id"
            " WHERE t.lane = :lane ORDER BY i.width, t.scope_id"), {"lane": lane}).mappings().all()]


def _split(rows):
    bad = [r for r in rows if r["width"] == poison.POISON_WIDTH]
    good = [r for r in rows if r["width"] != poison.POISON_WIDTH]
    return bad, good


class _Supervised:
    """A lane worker restarted whenever it exits, as ``memeflow up`` or compose's restart policy does."""

    def __init__(self, cluster, lane: str, **kwargs) -> None:
        self.cluster, self.lane, self.kwargs = cluster, lane, kwargs
        self.procs = [self._start()]

    def _start(self):
        return self.cluster.worker(self.lane, wait=False, **self.kwargs)

    def check(self) -> None:
        if not self.procs[-1].alive:
            self.procs.append(self._start())

    @property
    def exit_codes(self) -> list[int]:
        return [p.popen.returncode for p in self.procs if not p.alive]


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_visual_call_that_never_returns_is_cut_off_and_its_batch_mates_succeed(
        engine, it_settings, cluster, publisher, call_log, pool):
    settings = it_settings.replace(visual_provider="tests.support.poison:HangVisual", max_attempts=MAX_ATTEMPTS)
    cluster.settings = settings
    orch = Orchestrator(engine, settings)
    for scope, seed, size in [("tenant-a", 1, (poison.POISON_WIDTH, 40)), ("tenant-a", 2, (48, 40)),
                              ("tenant-b", 3, (48, 40)), ("tenant-b", 4, (48, 40))]:
        publisher.publish(store_and_ingest(orch, scope, png_bytes(seed, size)).hints)
    visual = _Supervised(cluster, "visual", pool=pool, MEMEFLOW_MAX_ATTEMPTS=str(MAX_ATTEMPTS),
                         MEMEFLOW_VISUAL_RUN_MAX_S=RUN_MAX_S)
    cluster.worker("agent", wait=False)
    cluster.worker("embedding", wait=False)

    def done():
        visual.check()
        return _no_active_jobs(engine)

    with Sweeper(orch, publisher, interval=0.3) as sweeper:
        poll_until(done, timeout=DEADLINE_S, interval=0.2, what="every job terminal")
    assert sweeper.errors == []

    bad, good = _split(_lane_rows(engine, "visual"))
    assert [(r["status"], r["attempt_count"], r["code"], r["job"]) for r in bad] == [
        ("failed", MAX_ATTEMPTS, "max_attempts_exceeded", "failed")]
    assert [(r["status"], r["job"]) for r in good] == [("succeeded", "succeeded")] * 3
    assert {r["scope_id"] for r in good} == {"tenant-a", "tenant-b"}
    hung = [sizes for lane, sizes, ok in poison.read_call_log(call_log) if lane == "visual" and not ok]
    assert hung[-MAX_ATTEMPTS:] == [[poison.POISON_WIDTH * 40]] * MAX_ATTEMPTS  # at the end, it hung alone
    if pool == "solo":  # each hang ended the process with the watchdog's code
        assert visual.exit_codes and set(visual.exit_codes) == {STAGE_TIMEOUT_EXIT}
    else:  # the pool replaced its child: the worker itself lived on
        assert len(visual.procs) == 1 and visual.procs[0].alive
    assert "ran past its maximum" in "".join(p.log() for p in visual.procs)


def test_a_local_agent_call_that_never_returns_ends_failed_and_its_neighbours_succeed(
        cluster, engine, publisher, call_log):
    settings = cluster.settings.replace(agent_provider="tests.support.poison:HangAgent", max_attempts=MAX_ATTEMPTS)
    cluster.settings = settings
    cluster.extra_env["MEMEFLOW_MAX_ATTEMPTS"] = str(MAX_ATTEMPTS)
    orch = Orchestrator(engine, settings)
    cluster.worker("visual", wait=False)
    cluster.worker("embedding", wait=False)
    for data in (png_bytes(1, (poison.POISON_WIDTH, 40)), png_bytes(2), png_bytes(3)):
        publisher.publish(store_and_ingest(orch, "local", data).hints)
    agent = _Supervised(cluster, "agent", pool="threads", concurrency=2, prefetch=2,
                        MEMEFLOW_AGENT_RUN_MAX_S=RUN_MAX_S)

    def done():
        agent.check()
        return _no_active_jobs(engine)

    with Sweeper(orch, publisher, interval=0.3) as sweeper:
        poll_until(done, timeout=DEADLINE_S, interval=0.2, what="every job terminal")
    assert sweeper.errors == []

    bad, good = _split(_lane_rows(engine, "agent"))
    # MAX_ATTEMPTS + 1: after its last death one recovery claim looked the attempt up (no call)
    assert [(r["status"], r["attempt_count"], r["code"], r["job"]) for r in bad] == [
        ("failed", MAX_ATTEMPTS + 1, "max_attempts_exceeded", "failed")]
    assert [(r["status"], r["attempt_count"], r["job"]) for r in good] == [("succeeded", 1, "succeeded")] * 2
    assert agent.exit_codes and set(agent.exit_codes) == {STAGE_TIMEOUT_EXIT}
    with engine.connect() as c:
        attempts = c.execute(text(
            "SELECT a.state, a.error->>'code' FROM task_attempts a JOIN tasks t ON t.id = a.task_id"
            " JOIN images i ON i.id = t.image_id WHERE i.width = :w ORDER BY a.attempt_no"),
            {"w": poison.POISON_WIDTH}).all()
    # every interrupted attempt says why: it ran past its maximum; the last one, that it was the last
    assert [tuple(a) for a in attempts[:-1]] == [("failed", "stage_timeout")] * (len(attempts) - 1)
    assert tuple(attempts[-1]) == ("failed", "max_attempts_exceeded")


def test_a_paid_agent_call_that_never_returns_ends_unknown_execution_and_is_never_repeated(
        cluster, engine, publisher, call_log):
    settings = cluster.settings.replace(agent_provider="tests.support.poison:HangPaidAgent")
    cluster.settings = settings
    orch = Orchestrator(engine, settings)
    cluster.worker("visual", wait=False)
    cluster.worker("embedding", wait=False)
    for data in (png_bytes(1, (poison.POISON_WIDTH, 40)), png_bytes(2)):
        publisher.publish(store_and_ingest(orch, "local", data).hints)
    agent = _Supervised(cluster, "agent", MEMEFLOW_AGENT_RUN_MAX_S=RUN_MAX_S)

    def done():
        agent.check()
        return _no_active_jobs(engine)

    with Sweeper(orch, publisher, interval=0.3) as sweeper:
        poll_until(done, timeout=DEADLINE_S, interval=0.2, what="every job terminal")
    assert sweeper.errors == []

    bad, good = _split(_lane_rows(engine, "agent"))
    assert [(r["status"], r["code"], r["job"]) for r in bad] == [
        ("failed", "unknown_execution", "unknown_execution")]
    assert [(r["status"], r["job"]) for r in good] == [("succeeded", "succeeded")]
    calls = [sizes for lane, sizes, ok in poison.read_call_log(call_log) if lane == "agent" and not ok]
    assert calls == [[poison.POISON_WIDTH * 40]]  # the paid call was made once, never again
    assert agent.exit_codes == [STAGE_TIMEOUT_EXIT]
