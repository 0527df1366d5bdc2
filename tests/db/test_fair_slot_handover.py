"""A freed agent-lane slot is handed to the fairest waiting task on every path that frees it
(SPEC §4.10, docs/architecture.md "Fairness") — on a real PostgreSQL."""

from __future__ import annotations

import dataclasses

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.errors import RetryableError
from app.stages.providers import Providers
from tests.support.agents import rows, step
from tests.support.pipeline import png_bytes, store_and_ingest


def test_a_retryable_failure_hands_its_freed_slot_to_the_waiting_scope(engine, settings):
    """Lane limit 1: tenant A's agent task runs, tenant B's claim is refused (B now waits unhinted).
    A's task fails with a retryable error (a flaky provider): its slot frees, and B's task must be
    hinted by that transaction — not left idle until the next sweep, as after a success or a
    permanent failure."""
    settings = dataclasses.replace(settings, agent_lane_limit=1, backoff_base_s=60, backoff_max_s=60)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    pub.publish(store_and_ingest(orch, "tenant-a", png_bytes(8100)).hints)
    hint_a = step(orch, providers, pub, stop_lane="agent")
    pub.publish(store_and_ingest(orch, "tenant-b", png_bytes(8101)).hints)
    hint_b = step(orch, providers, pub, stop_lane="agent")
    assert hint_a is not None and hint_b is not None
    [claim_a] = orch.claim_agent_batch(hint_a.task_id, 1, "w1")
    assert orch.claim_agent_batch(hint_b.task_id, 1, "w2") == []  # the one slot is A's: refused
    assert rows(engine, "SELECT last_hint_at FROM tasks WHERE id = :t", t=hint_b.task_id) == [(None,)]

    hints = orch.fail_task(claim_a, RetryableError("provider busy"))

    assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id IS NOT NULL") == [(0,)]
    assert [h.task_id for h in hints if h.lane == "agent"] == [hint_b.task_id]
    assert rows(engine, "SELECT last_hint_at IS NOT NULL FROM tasks WHERE id = :t", t=hint_b.task_id) == [(True,)]
    assert len(orch.claim_agent_batch(hint_b.task_id, 1, "w2")) == 1
