"""The worker's heartbeats (app/worker/run.py): one beater thread per process serves every running
claim, extends each lease while its block runs, stops a cancelled one, and never beats after the
block ended (the terminal write comes after the last beat)."""

from __future__ import annotations

import threading

from sqlalchemy import text

from app.orchestrator import Orchestrator
from app.worker import run
from tests.conftest import poll_until
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task


def _lease(engine, task_id):
    with engine.connect() as c:
        return c.execute(text("SELECT lease_expires_at FROM tasks WHERE id = :t"), {"t": task_id}).scalar()


def _claims(orch, n, seed):
    out = []
    for i in range(n):
        res = store_and_ingest(orch, "local", png_bytes(seed + i))
        claim = orch.claim_task(visual_task(res).task_id, f"w{i}")
        assert claim is not None
        out.append(claim)
    return out


def _beater_threads():
    return [t for t in threading.enumerate() if t.name == "heartbeat"]


def test_one_thread_beats_every_open_block_and_none_after_it_ended(engine, settings):
    orch = Orchestrator(engine, settings.replace(heartbeat_s=0.2, lease_s=30))
    a, b = _claims(orch, 2, 7100)
    first = {c.task_id: _lease(engine, c.task_id) for c in (a, b)}
    with run.Heartbeat(orch, [a]) as ha, run.Heartbeat(orch, [b]) as hb:
        poll_until(lambda: all(_lease(engine, c.task_id) > first[c.task_id] for c in (a, b)),
                   timeout=20, what="both leases extended")
        assert len(_beater_threads()) == 1
        assert not ha.stop_requested.is_set() and not hb.stop_requested.is_set()
    ended = {c.task_id: _lease(engine, c.task_id) for c in (a, b)}
    # three heartbeat periods later no beat has landed for either block
    threading.Event().wait(0.6)
    assert {c.task_id: _lease(engine, c.task_id) for c in (a, b)} == ended
    assert len(_beater_threads()) == 1  # it stays, idle, for the next task


def test_a_cancel_request_sets_stop_requested_of_that_block_only(engine, settings):
    orch = Orchestrator(engine, settings.replace(heartbeat_s=0.2, lease_s=30))
    a, b = _claims(orch, 2, 7200)
    with engine.begin() as c:
        c.execute(text("UPDATE tasks SET cancel_requested = true WHERE id = :t"), {"t": a.task_id})
    with run.Heartbeat(orch, [a]) as ha, run.Heartbeat(orch, [b]) as hb:
        poll_until(ha.stop_requested.is_set, timeout=20, what="the cancelled block told to stop")
        lease_b = _lease(engine, b.task_id)
        poll_until(lambda: _lease(engine, b.task_id) > lease_b, timeout=20, what="the other block beats on")
        assert not hb.stop_requested.is_set()


def test_a_block_ended_mid_beat_waits_for_that_beat(engine, settings):
    """__exit__ returns only after a beat of its claims in flight ended."""
    orch = Orchestrator(engine, settings.replace(heartbeat_s=0.1, lease_s=30))
    (a,) = _claims(orch, 1, 7300)
    started, release, order = threading.Event(), threading.Event(), []
    real = orch.heartbeat

    def slow_beat(claim):
        started.set()
        release.wait(10)
        order.append("beat")
        return real(claim)

    orch.heartbeat = slow_beat
    hb = run.Heartbeat(orch, [a]).__enter__()
    assert started.wait(20), "no beat started"
    exiting = threading.Thread(target=lambda: (hb.__exit__(None, None, None), order.append("exit")))
    exiting.start()
    threading.Event().wait(0.2)
    assert order == []  # still waiting for the beat
    release.set()
    exiting.join(10)
    assert order == ["beat", "exit"]

