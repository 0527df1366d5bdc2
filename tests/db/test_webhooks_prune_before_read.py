"""A prune between a claim and its first event read (the receiver's name is being resolved then,
which may take seconds) resets the subscription's attempts for the next event — the claim must
not charge the attempts it read at claim time, spent on the pruned event, to the next one."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator
from app.worker import webhooks as lane
from app.worker.webhook_sender import SendResult
from app.worker.webhooks import deliver_subscription
from tests.db.test_webhooks import emit
from tests.db.test_webhooks_retention import DAY_S, prune_after_retention
from tests.support.clock import FakeClock


@pytest.fixture()
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture()
def orch(engine, settings, clock) -> Orchestrator:
    return Orchestrator(engine, settings.replace(
        webhook_allowed_networks="127.0.0.0/8", webhook_backoff_base_s=1.0, webhook_backoff_max_s=2.0,
        webhook_timeout_s=1.0, webhook_max_attempts=3, events_retention_s=DAY_S,
    ), clock=clock)


def _failing(url, secret, event, **kw) -> SendResult:
    return SendResult(False, 500, "http_error", "HTTP 500")


def test_a_prune_while_resolving_does_not_charge_the_pruned_events_attempts_to_the_next(orch, engine, clock,
                                                                                       monkeypatch):
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", "http://127.0.0.1:9/x")
    sub = uuid.UUID(hook["id"])
    [first] = emit(orch, "local", 1)
    for _ in range(orch.settings.webhook_max_attempts - 1):  # max_attempts = 3: two failures spent on it
        deliver_subscription(orch, sub, "w", send=_failing)
        clock.advance(10)
    assert orch.list_webhooks("local")[0]["attempts"] == 2

    real_resolve = lane.resolve_receiver
    second = []

    def resolve_while_the_sweep_prunes(url, networks, **kw):
        if not second:  # the sweep prunes the retried event (and a new one commits) during the lookup
            assert prune_after_retention(orch) == 1
            second.extend(emit(orch, "local", 1))
        return real_resolve(url, networks, **kw)

    monkeypatch.setattr(lane, "resolve_receiver", resolve_while_the_sweep_prunes)
    deliver_subscription(orch, sub, "w", send=_failing)  # the claim read attempts = 2 (of the pruned event)
    [state] = orch.list_webhooks("local")
    # the new event failed once: one attempt of its own, not given up on its first failure
    assert (state["cursor"], state["attempts"]) == (first, 1), state
    with engine.connect() as c:
        failures = c.execute(text("SELECT event_id, error->>'code' FROM webhook_failures ORDER BY id")).all()
    assert [tuple(f) for f in failures] == [(first, "events_expired")]
