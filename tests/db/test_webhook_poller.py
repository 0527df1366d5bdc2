"""The webhooks workers' hint poller sleeps while no subscription exists (no poll at all) and a
new subscription's commit wakes it at once (LISTEN/NOTIFY), long before its own idle re-check;
without a LISTEN connection it polls as before."""

from __future__ import annotations

import threading

import pytest

from app.orchestrator import Orchestrator
from app.orchestrator.store import events as events_q
from app.worker.webhooks import HintPoller
from tests.conftest import poll_until


class Publisher:
    def __init__(self) -> None:
        self.hints: list = []

    def publish(self, hints) -> None:
        self.hints.extend(hints)


class CountingOrch:
    """The orchestrator with a count of the poller's polls (webhook_hints calls)."""

    def __init__(self, orch: Orchestrator) -> None:
        self._orch, self.polls, self._lock = orch, 0, threading.Lock()

    def __getattr__(self, name):
        return getattr(self._orch, name)

    def webhook_hints(self, limit=None):
        with self._lock:
            self.polls += 1
        return self._orch.webhook_hints(limit)


@pytest.fixture()
def orch(engine, settings) -> Orchestrator:
    return Orchestrator(engine, settings.replace(webhook_allowed_networks="127.0.0.0/8", webhook_poll_s=0.02))


def test_idle_without_subscriptions_and_a_new_one_wakes_it_at_once(orch):
    counting, pub = CountingOrch(orch), Publisher()
    poller = HintPoller(counting, pub, idle_check_s=600).start()  # only the announcement can wake it
    try:
        poll_until(poller.idle.is_set, timeout=10, what="the poller idle")
        # idle: twenty poll intervals pass without a single poll
        assert not poller._stop.wait(20 * orch.settings.webhook_poll_s)
        assert counting.polls == 0
        hook, _ = orch.create_webhook("local", "http://127.0.0.1:9/x")
        with orch.engine.begin() as c:
            events_q.stage_event_txn(c, "local", "batch.progress", {"n": 1})
        poll_until(lambda: any(str(h.task_id) == hook["id"] for h in pub.hints), timeout=10,
                   what="a hint for the new subscription")
        assert not poller.idle.is_set()
    finally:
        poller.stop()


def test_goes_idle_again_when_the_last_subscription_is_deleted(orch):
    hook, _ = orch.create_webhook("local", "http://127.0.0.1:9/x")
    poller = HintPoller(CountingOrch(orch), Publisher(), idle_check_s=0.05).start()
    try:
        assert not poller.idle.wait(0.3)  # a subscription exists: it polls
        orch.delete_webhook("local", hook["id"])
        poll_until(poller.idle.is_set, timeout=10, what="the poller idle after the delete")
    finally:
        poller.stop()


def test_without_a_listen_connection_it_polls(orch, monkeypatch):
    counting = CountingOrch(orch)
    poller = HintPoller(counting, Publisher(), idle_check_s=600)
    monkeypatch.setattr(poller, "_listen", lambda: False)
    poller.start()
    try:
        poll_until(lambda: counting.polls >= 3, timeout=10, what="polls without a listener")
        assert not poller.idle.is_set()
    finally:
        poller.stop()
