"""A retried task wakes when its backoff ends (SPEC §4.4, §2.7; docs/architecture.md "Delayed
hints"): the retry's transaction marks the task hinted as of its ``available_at`` and returns a
hint whose ``eta`` is that moment, published after the commit. Before, the requeue cleared the
hint and nothing woke the task when it became due: a 2 s backoff waited for the next sweep
(``MEMEFLOW_SWEEP_INTERVAL_S``, 15 s by default), however short the backoff."""

from __future__ import annotations

from datetime import timedelta

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.hints import Hint
from app.stages.errors import RetryableError
from tests.support.agents import rows
from tests.support.clock import FakeClock
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task


def _claimed(engine, settings, seed: int):
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    task_id = visual_task(store_and_ingest(orch, "local", png_bytes(seed))).task_id
    claim = orch.claim_task(task_id, "w1")
    assert claim is not None
    return orch, clock, task_id, claim


def _task(engine, task_id):
    return rows(engine, "SELECT status, available_at, last_hint_at FROM tasks WHERE id = :t", t=task_id)[0]


def test_a_retry_returns_a_hint_due_when_its_backoff_ends_and_the_sweep_leaves_it_alone(engine, settings):
    settings = settings.replace(backoff_base_s=2.0, backoff_max_s=2.0, rehint_grace_s=30.0)
    orch, clock, task_id, claim = _claimed(engine, settings, 41)
    pub = RecordingPublisher()
    failed_at = clock()

    pub.publish(orch.fail_task(claim, RetryableError("provider busy", code="busy")))

    status, available_at, last_hint_at = _task(engine, task_id)
    assert status == "queued"
    assert failed_at + timedelta(seconds=1) <= available_at <= failed_at + timedelta(seconds=2)  # full jitter
    # published after the commit, for the moment the task becomes claimable (a hair after it)
    assert [(h.lane, h.task_id) for h in pub.published] == [("visual", task_id)]
    eta = getattr(pub.published[0], "eta", None)
    assert eta is not None and available_at <= eta <= available_at + timedelta(milliseconds=50)
    # its hint is live from the moment it can claim: no fairness path or sweep hints it again
    assert last_hint_at == available_at

    assert orch.claim_task(task_id, "w2") is None  # not due yet (a hint taken early is stale)
    clock.advance(2.5)  # due; the delayed hint is on its way
    assert task_id not in {h.task_id for h in orch.sweep().hints}
    claim2 = orch.claim_task(task_id, "w2")  # what the delayed hint does
    assert claim2 is not None and claim2.attempt_count == 2


def test_a_lost_delayed_hint_is_repaired_by_the_sweep_one_grace_after_the_task_was_due(engine, settings):
    settings = settings.replace(backoff_base_s=2.0, backoff_max_s=2.0, rehint_grace_s=30.0)
    orch, clock, task_id, claim = _claimed(engine, settings, 42)
    orch.fail_task(claim, RetryableError("provider busy"))  # its hint is never published (lost)

    clock.advance(2 + 29)  # due, but its hint not yet older than the grace: still counted live
    assert task_id not in {h.task_id for h in orch.sweep().hints}
    clock.advance(2)
    assert Hint("visual", task_id) in orch.sweep().hints


def test_a_backoff_past_the_delayed_hint_bound_is_left_to_the_sweep(engine, settings):
    """A wait longer than ``MEMEFLOW_DELAYED_HINT_MAX_S`` (a provider's Retry-After of an hour)
    sends no hint now: an eta message waits unacknowledged in a worker's memory, and Redis
    delivers one again once it is older than the transport's visibility timeout. The sweep
    hints it once it is due, as before."""
    settings = settings.replace(delayed_hint_max_s=60.0)
    orch, clock, task_id, claim = _claimed(engine, settings, 43)

    hints = orch.fail_task(claim, RetryableError("rate limited", retry_after_s=600.0))

    assert [h for h in hints if h.task_id == task_id] == []
    status, available_at, last_hint_at = _task(engine, task_id)
    assert (status, last_hint_at) == ("queued", None)
    clock.advance(601)
    assert Hint("visual", task_id) in orch.sweep().hints


def test_delayed_hints_can_be_turned_off(engine, settings):
    settings = settings.replace(delayed_hint_max_s=0.0)
    orch, clock, task_id, claim = _claimed(engine, settings, 44)

    assert orch.fail_task(claim, RetryableError("provider busy")) == []
    assert _task(engine, task_id)[2] is None
