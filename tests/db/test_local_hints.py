"""Local continuation of hints (app/worker/run.py ``LocalHints``, ``handle_hint_locally``): a
worker handles the hint its completion returned for a lane it consumes, through the same claims
and completions, instead of publishing it; a worker that dies before claiming a kept hint leaves
exactly what a lost broker message leaves, and the sweep recovers it."""

from __future__ import annotations

import dataclasses

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.hints import Hint
from app.stages.providers import Providers
from app.worker.run import LocalHints, handle_hint, handle_hint_locally
from tests.support.clock import FakeClock
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task

ALL = ("visual", "agent", "embedding")


def _rows(engine, sql, **params):
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(sql), params).all()]


def _setup(engine, settings, seeds, clock=None):
    settings = dataclasses.replace(settings, agent_batch_size=4)
    orch = Orchestrator(engine, settings, clock=clock) if clock else Orchestrator(engine, settings)
    hints = [visual_task(store_and_ingest(orch, "local", png_bytes(s))) for s in seeds]
    return orch, settings, hints


def _jobs(engine):
    return _rows(engine, "SELECT status, count(*) FROM processing_jobs GROUP BY 1")


def test_a_worker_of_every_lane_runs_the_whole_chain_and_publishes_nothing(engine, settings):
    orch, settings, hints = _setup(engine, settings, [201, 202, 203])
    pub = RecordingPublisher()
    claimed = handle_hint_locally(orch, "visual", hints[0].task_id, "w1", Providers(settings), pub, ALL, 8)
    assert claimed == 9  # 3 visual, then their agent group, then their embedding group
    assert _jobs(engine) == [("succeeded", 3)]
    assert pub.published == []
    assert _rows(engine, "SELECT lane, count(*) FROM tasks WHERE status = 'succeeded' GROUP BY 1 ORDER BY 1") == [
        ("agent", 3), ("embedding", 3), ("visual", 3)]


def test_hints_for_lanes_the_worker_does_not_consume_are_published(engine, settings):
    orch, settings, hints = _setup(engine, settings, [211, 212])
    pub = RecordingPublisher()
    assert handle_hint_locally(orch, "visual", hints[0].task_id, "w1", Providers(settings), pub, ["visual"], 8) == 2
    assert [h.lane for h in pub.drain()] == ["agent"]
    assert _rows(engine, "SELECT status, count(*) FROM tasks WHERE lane = 'agent' GROUP BY 1") == [("queued", 2)]


def test_the_chain_stops_at_its_limit_and_publishes_the_next_hint(engine, settings):
    orch, settings, hints = _setup(engine, settings, [221, 222])
    pub = RecordingPublisher()
    assert handle_hint_locally(orch, "visual", hints[0].task_id, "w1", Providers(settings), pub, ALL, 1) == 4
    [left] = pub.drain()
    assert left.lane == "embedding"
    assert handle_hint(orch, "embedding", left.task_id, "w2", Providers(settings), pub) == 2
    assert _jobs(engine) == [("succeeded", 2)]


def test_a_busy_worker_hands_its_kept_hint_to_the_broker(engine, settings):
    orch, settings, hints = _setup(engine, settings, [231])
    pub = RecordingPublisher()
    assert handle_hint_locally(orch, "visual", hints[0].task_id, "w1", Providers(settings), pub, ALL, 8,
                               busy=lambda: True) == 1
    assert [h.lane for h in pub.drain()] == ["agent"]


def test_one_hint_is_kept_at_a_time_the_others_go_to_the_broker_now():
    broker = RecordingPublisher()
    local = LocalHints(broker, ["agent", "embedding"], 8)
    a1, a2, w = Hint("agent", _uuid(1)), Hint("agent", _uuid(2)), Hint("webhooks", _uuid(3))
    local.publish([w, a1, a2])
    assert local.kept == a1 and broker.drain() == [w, a2]  # a2: another worker may take it in parallel
    local.handoff([Hint("embedding", _uuid(4))])  # e.g. group members a batch budget left out
    assert [h.lane for h in broker.drain()] == ["embedding"] and local.kept == a1
    local.release()
    assert broker.drain() == [a1] and local.kept is None
    local.publish([a2])
    assert broker.drain() == [a2]  # released: keeps no more


def _uuid(i):
    import uuid

    return uuid.UUID(int=i)


def test_a_worker_dying_before_claiming_its_kept_hint_leaves_a_lost_message_the_sweep_recovers(engine, settings):
    clock = FakeClock()
    orch, settings, hints = _setup(engine, settings, [241, 242, 243], clock=clock)
    pub = RecordingPublisher()
    local = LocalHints(pub, ALL, 8)
    # the worker completes the visual batch (committed), keeps its agent hint ... and dies: the
    # kept hint is never handled nor published
    assert handle_hint(orch, "visual", hints[0].task_id, "w-dead", Providers(settings), local) == 3
    kept = local.kept
    assert kept is not None and kept.lane == "agent" and pub.published == []
    assert _rows(engine, "SELECT status, last_hint_at IS NOT NULL, count(*) FROM tasks WHERE lane = 'agent'"
                         " GROUP BY 1, 2") == [("queued", True, 3)]  # queued and hinted, like a message in flight
    assert orch.sweep().hints == []  # its hint counts as live until the grace period passes
    clock.advance(settings.rehint_grace_s + 1)
    rehinted = orch.sweep().hints
    assert kept in rehinted and {h.lane for h in rehinted} == {"agent"}
    for hint in rehinted:  # another worker takes the re-hints (a group member's finds its group claimed)
        handle_hint_locally(orch, hint.lane, hint.task_id, "w-next", Providers(settings), pub, ALL, 8)
    assert _jobs(engine) == [("succeeded", 3)]
    assert _rows(engine, "SELECT lane, count(*) FROM tasks GROUP BY 1 ORDER BY 1") == [
        ("agent", 3), ("embedding", 3), ("visual", 3)]  # nothing ran twice
    assert _rows(engine, "SELECT count(*) FROM task_attempts") == [(3,)]  # one paid call per task
