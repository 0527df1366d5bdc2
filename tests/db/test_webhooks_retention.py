"""Retention meets webhook subscriptions: the sweep prunes events older than
``events_retention_s`` whether or not every subscription has delivered them. A subscription whose
cursor had not reached them is told in the same transaction — cursor past them, counted failed,
``last_error`` ``events_expired``, one ``webhook_failures`` row for the range — and the attempts
it spent on the first of them are not charged to the next event."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator
from app.orchestrator.events import prune_events
from app.worker.webhook_sender import SendResult
from app.worker.webhooks import deliver_subscription
from tests.db.test_webhooks import emit
from tests.support.clock import FakeClock
from tests.support.receiver import Receiver

DAY_S = 86400.0


@pytest.fixture()
def receiver():
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture()
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture()
def orch(engine, settings, clock) -> Orchestrator:
    """The lane's clock is the test's: backoffs pass and events age only when it advances."""
    return Orchestrator(engine, settings.replace(
        webhook_allowed_networks="127.0.0.0/8", webhook_backoff_base_s=1.0, webhook_backoff_max_s=2.0,
        webhook_timeout_s=1.0, webhook_max_attempts=3, events_retention_s=DAY_S,
    ), clock=clock)


def prune_after_retention(orch: Orchestrator) -> int:
    """The sweep's prune two days on (events are stamped by the database's clock, not the test's)."""
    later = Orchestrator(orch.engine, orch.settings, clock=lambda: datetime.now(timezone.utc) + timedelta(days=2))
    return prune_events(later)


def test_pruning_events_a_subscription_has_not_delivered_is_recorded(orch, receiver, engine, clock):
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", receiver.url("/ok"))
    other, _ = orch.create_webhook("local", receiver.url("/ok?image-only"), ["image.deleted"])
    ids = emit(orch, "local", 3)  # the webhooks lane was down for longer than retention
    assert prune_after_retention(orch) == 3
    newer = emit(orch, "local", 1)
    for h in orch.webhook_hints():
        deliver_subscription(orch, h.task_id, "w")
    assert [r.event["id"] for r in receiver.at("/ok")] == newer  # the pruned ones cannot be sent
    state = {w["id"]: w for w in orch.list_webhooks("local")}
    told = state[hook["id"]]
    assert told["failed_count"] == 3 and told["delivered_count"] == 1 and told["attempts"] == 0
    assert told["cursor"] == newer[0]
    with engine.connect() as c:
        failures = c.execute(text("SELECT subscription_id, event_id, error FROM webhook_failures")).all()
    assert [(str(f.subscription_id), f.event_id) for f in failures] == [(hook["id"], ids[-1])]
    error = failures[0].error
    assert error["code"] == "events_expired" and error["count"] == 3
    assert (error["first_event_id"], error["last_event_id"]) == (ids[0], ids[-1])
    untouched = state[other["id"]]  # took none of the pruned types: nothing expired for it
    assert untouched["failed_count"] == 0 and untouched["last_error"] is None


def test_attempts_spent_on_a_pruned_event_are_not_charged_to_the_next(orch, receiver, clock):
    """A lagging subscription is retrying its oldest undelivered event — the one retention prunes
    first. The next event gets its own ``webhook_max_attempts``."""
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", receiver.url("/fail/2"))  # each event: 500, 500, then 200
    sub = uuid.UUID(hook["id"])
    first = emit(orch, "local", 1)[0]
    for _ in range(2):
        deliver_subscription(orch, sub, "w")  # fails: backoff
        clock.advance(10)  # the backoff (≤ 2 s) is over
    assert orch.list_webhooks("local")[0]["attempts"] == 2
    prune_after_retention(orch)
    second = emit(orch, "local", 1)[0]
    for _ in range(3):  # max_attempts = 3: the fresh event survives its two 500s
        deliver_subscription(orch, sub, "w")
        clock.advance(10)
    got = [(r.event["id"], r.status) for r in receiver.at("/fail")]
    assert got == [(first, 500), (first, 500), (second, 500), (second, 500), (second, 200)]
    state = orch.list_webhooks("local")[0]
    assert state["delivered_count"] == 1 and state["failed_count"] == 1  # the pruned one
    assert state["last_error"] is None and state["cursor"] == second


def _failing(url, secret, event, **kw) -> SendResult:
    return SendResult(False, 500, "http_error", "HTTP 500")


def _lease_and_rejections(engine, sub: uuid.UUID) -> tuple[object, int]:
    with engine.connect() as c:
        lease = c.execute(text("SELECT lease_owner FROM webhook_subscriptions WHERE id = :i"), {"i": sub}).scalar_one()
        rejected = c.execute(text(
            "SELECT coalesce(sum(count), 0) FROM ops_counters WHERE name = 'fencing_rejection'")).scalar_one()
    return lease, rejected


def test_a_prune_during_a_failing_post_does_not_charge_its_attempts_to_the_next_event(orch, engine, clock):
    """The prune takes FOR NO KEY UPDATE, the POST holds FOR KEY SHARE: they do not wait for each
    other. The failure written after the POST belongs to an event that is gone: the next event
    starts at attempts 0."""
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", "http://127.0.0.1:9/x")
    sub = uuid.UUID(hook["id"])
    [first] = emit(orch, "local", 1)
    deliver_subscription(orch, sub, "w", send=_failing)  # attempt 1: backoff
    clock.advance(10)

    def failing_while_pruned(url, secret, event, **kw) -> SendResult:
        assert prune_after_retention(orch) == 1  # the sweep's prune, during this POST
        return _failing(url, secret, event)

    deliver_subscription(orch, sub, "w", send=failing_while_pruned)  # attempt 2; its event pruned meanwhile
    [state] = orch.list_webhooks("local")
    assert (state["cursor"], state["attempts"]) == (first, 0)
    assert _lease_and_rejections(engine, sub) == (None, 0)


def test_a_prune_during_a_successful_post_is_no_fencing_rejection(orch, engine, clock):
    """The event delivered was pruned meanwhile (the cursor is past it already): the claim goes on
    with the next event and ends released — not counted as fenced out, not left leased."""
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", "http://127.0.0.1:9/x")
    sub = uuid.UUID(hook["id"])
    [first] = emit(orch, "local", 1)
    sent, later = [], []

    def ok_while_pruned(url, secret, event, **kw) -> SendResult:
        sent.append(event["id"])
        if event["id"] == first:
            assert prune_after_retention(orch) == 1
            later.extend(emit(orch, "local", 1))
        return SendResult(True, 200)

    assert deliver_subscription(orch, sub, "w", send=ok_while_pruned) == []
    assert sent == [first, *later]
    [state] = orch.list_webhooks("local")
    assert (state["cursor"], state["attempts"]) == (later[0], 0)
    assert _lease_and_rejections(engine, sub) == (None, 0)


def test_a_prune_during_the_last_failing_post_is_no_fencing_rejection(orch, engine, clock):
    """Its last attempt fails while the event is pruned: the prune recorded it already (one
    webhook_failures row, events_expired) and the claim ends released, not fenced out."""
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", "http://127.0.0.1:9/x")
    sub = uuid.UUID(hook["id"])
    [first] = emit(orch, "local", 1)
    for _ in range(orch.settings.webhook_max_attempts - 1):
        deliver_subscription(orch, sub, "w", send=_failing)
        clock.advance(10)

    def failing_while_pruned(url, secret, event, **kw) -> SendResult:
        assert prune_after_retention(orch) == 1
        return _failing(url, secret, event)

    deliver_subscription(orch, sub, "w", send=failing_while_pruned)  # the last attempt
    [state] = orch.list_webhooks("local")
    assert (state["cursor"], state["attempts"], state["failed_count"]) == (first, 0, 1)
    with engine.connect() as c:
        codes = c.execute(text("SELECT error->>'code' FROM webhook_failures")).scalars().all()
    assert codes == ["events_expired"]
    assert _lease_and_rejections(engine, sub) == (None, 0)
