"""Agent workers given different agent lane limits still share one DB-wide limit: the most
conservative of the live agent workers' (SPEC §4.10; app/orchestrator/lane_limits.py) — on a real
PostgreSQL, two orchestrators standing for two worker processes, each registered as it would be."""

from __future__ import annotations

import dataclasses
import logging
import threading
from datetime import UTC, datetime

from sqlalchemy import event

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.liveness import WorkerIdentity, read_liveness, register_worker
from app.stages.providers import Providers
from tests.support.agents import rows, step
from tests.support.pipeline import png_bytes, store_and_ingest


def _agent_worker(engine, settings, node: str, **limits) -> Orchestrator:
    """An agent worker process given ``limits``: its orchestrator, registered as the worker would be."""
    settings = dataclasses.replace(settings, lease_s=600.0, **limits)  # claims outlive the test
    register_worker(engine, WorkerIdentity.of(settings, node, ("agent", "maintenance"), datetime.now(UTC)))
    return Orchestrator(engine, settings)


def _agent_hints(engine, settings, n: int, seed: int) -> list:
    """``n`` queued agent tasks (one upload each, its visual stage run), hinted."""
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    hints = []
    for i in range(n):
        pub.publish(store_and_ingest(orch, "tenant-a", png_bytes(seed + i)).hints)
        hints.append(step(orch, providers, pub, stop_lane="agent"))
    assert all(h is not None for h in hints)
    return hints


def _race(workers: list[Orchestrator], hints: list) -> int:
    """Every worker claims its share of the hints at once (one thread each); how many were claimed."""
    claimed, lock, go = [], threading.Lock(), threading.Barrier(len(workers))

    def run(i: int, orch: Orchestrator) -> None:
        go.wait()
        for h in hints[i::len(workers)]:
            got = orch.claim_agent_batch(h.task_id, 1, f"w{i}")
            with lock:
                claimed.extend(got)

    threads = [threading.Thread(target=run, args=(i, o)) for i, o in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return len(claimed)


HELD = "SELECT count(*) FROM lane_slots WHERE lane = 'agent' AND task_id IS NOT NULL"
RUNNING = "SELECT count(*) FROM tasks WHERE lane = 'agent' AND status = 'running'"


def test_workers_with_different_lane_limits_never_hold_more_than_the_smaller(engine, settings):
    """One agent worker was given 4, another 8 (a rolling change of MEMEFLOW_AGENT_LANE_LIMIT):
    each admitted up to its own, so the deployment ran 8 paid calls at once."""
    a = _agent_worker(engine, settings, "agent-a@h1", agent_lane_limit=4)
    b = _agent_worker(engine, settings, "agent-b@h2", agent_lane_limit=8)
    hints = _agent_hints(engine, settings, 12, 9100)

    claimed = _race([a, b, a, b], hints)

    assert 1 <= claimed <= 4
    assert rows(engine, HELD) == [(claimed,)] and rows(engine, RUNNING) == [(claimed,)]
    with engine.connect() as c:  # none above the smaller limit's slots was ever taken
        assert c.exec_driver_sql("SELECT count(*) FROM lane_slots WHERE lane = 'agent' AND slot_no >= 4"
                                 " AND task_id IS NOT NULL").scalar() == 0


def test_a_worker_given_no_limit_beside_one_given_4_holds_to_4(engine, settings):
    """MEMEFLOW_AGENT_LANE_LIMIT=0 (unlimited) on one host: that worker skipped the slots entirely,
    removing the paid provider's guard for the whole deployment."""
    guarded = _agent_worker(engine, settings, "agent-a@h1", agent_lane_limit=4)
    unlimited = _agent_worker(engine, settings, "agent-b@h2", agent_lane_limit=0)
    hints = _agent_hints(engine, settings, 10, 9200)

    claimed = _race([unlimited, guarded, unlimited], hints)

    assert 1 <= claimed <= 4
    assert rows(engine, RUNNING) == [(claimed,)] and rows(engine, HELD) == [(claimed,)]


def test_a_resource_limit_given_to_one_worker_binds_the_other(engine, settings):
    """The per provider-model limit too: one worker given MEMEFLOW_AGENT_RESOURCE_LIMIT=2, the other none."""
    a = _agent_worker(engine, settings, "agent-a@h1", agent_lane_limit=0, agent_resource_limit=2)
    b = _agent_worker(engine, settings, "agent-b@h2", agent_lane_limit=0, agent_resource_limit=0)
    hints = _agent_hints(engine, settings, 8, 9300)

    claimed = _race([b, a], hints)

    assert 1 <= claimed <= 2
    assert rows(engine, RUNNING) == [(claimed,)]


def test_the_limits_in_force_are_read_once_per_registry_interval_not_per_claim(engine, settings):
    """The claim is on the throughput hot path: agreeing workers' claims run no registry read."""
    settings = dataclasses.replace(settings, worker_registry_interval_s=3600.0)
    orch = _agent_worker(engine, settings, "agent-a@h1", agent_lane_limit=4)
    _agent_worker(engine, settings, "agent-b@h2", agent_lane_limit=4)
    hints = _agent_hints(engine, settings, 3, 9400)
    seen: list[str] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", capture)
    try:
        for h in hints:
            assert len(orch.claim_agent_batch(h.task_id, 1, "w")) == 1
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert sum("worker_registry" in s for s in seen) == 1  # the first claim's only


def test_disagreement_is_logged_and_a_degraded_reason(engine, settings, caplog):
    a = _agent_worker(engine, settings, "agent-a@h1", agent_lane_limit=4)
    _agent_worker(engine, settings, "agent-b@h2", agent_lane_limit=0)
    [hint] = _agent_hints(engine, settings, 1, 9500)

    with caplog.at_level(logging.WARNING, logger="app.orchestrator.lane_limits"):
        assert len(a.claim_agent_batch(hint.task_id, 1, "w")) == 1
    assert any("disagree" in r.getMessage() and "agent-b@h2=0/0" in r.getMessage() for r in caplog.records)

    live = read_liveness(engine, settings)
    assert [r["code"] for r in live.reasons if r["code"] == "lane_limits_disagree"] == ["lane_limits_disagree"]
    limits = live.as_dict()["agent_limits"]
    assert limits["in_force"] == {"lane": 4, "resource": 0} and limits["disagree"] is True
    assert limits["given"] == [{"lane": 4, "resource": 0, "workers": 1}, {"lane": 0, "resource": 0, "workers": 1}]
    assert "agent-a@h1" not in str(live.as_dict()) and "agent-b@h2" not in str(live.reasons)  # no host names


def test_agreeing_workers_are_not_a_degraded_reason(engine, settings):
    _agent_worker(engine, settings, "agent-a@h1", agent_lane_limit=4)
    _agent_worker(engine, settings, "agent-b@h2", agent_lane_limit=4)
    register_worker(engine, WorkerIdentity.of(settings, "visual@h3", ("visual",), datetime.now(UTC)))
    live = read_liveness(engine, settings)
    assert "lane_limits_disagree" not in [r["code"] for r in live.reasons]
    assert live.as_dict()["agent_limits"]["given"] == [{"lane": 4, "resource": 0, "workers": 2}]


def test_memeflow_status_shows_the_disagreement_and_the_limit_in_force(engine, settings):
    from app.cli.status import _sweep_caption, overview_tables

    _agent_worker(engine, settings, "agent-a@h1", agent_lane_limit=8)
    _agent_worker(engine, settings, "agent-b@h2", agent_lane_limit=3)
    _, _, data = overview_tables(engine, "tenant-a", 16, settings)  # this shell was given 16
    live = data["liveness"]
    assert "lane_limits_disagree" in [r["code"] for r in live["reasons"]]
    assert live["agent_limits"]["in_force"] == {"lane": 3, "resource": 0}
    assert "3/0 on 1" in _sweep_caption(read_liveness(engine, settings))
