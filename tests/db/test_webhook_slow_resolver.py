"""A receiver's nameserver that stalls is bounded like a receiver that stalls: the lookup gets the
exchange's timeout, then the delivery is a recorded ``timeout`` failure (backoff, attempts) — not a
claim that outlives its lease, which a duplicated hint could then claim again and POST the same
event alongside (two claims delivering one subscription at once)."""

from __future__ import annotations

import ipaddress
import socket as socket_module
import threading
import time
import uuid

import pytest
from sqlalchemy import text

from app import netguard
from app.orchestrator import Orchestrator
from app.orchestrator.errors import InvalidWebhook
from app.worker.webhook_sender import SendResult, resolve_receiver
from app.worker.webhooks import deliver_subscription
from tests.db.test_webhooks import emit

STALL_S = 8.0  # the nameserver's silence: far past the 0.5 s timeout the lane gives it


@pytest.fixture()
def orch(engine, settings) -> Orchestrator:
    return Orchestrator(engine, settings.replace(
        webhook_allowed_networks="127.0.0.0/8", webhook_timeout_s=0.5, webhook_lease_s=2.0,
        webhook_backoff_base_s=0.01, webhook_backoff_max_s=0.02, webhook_max_attempts=3,
    ))


def test_a_stalling_nameserver_is_a_timeout_failure_within_the_lease(orch, engine, monkeypatch):
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", "http://127.0.0.1:9/x")
    sub = uuid.UUID(hook["id"])
    with engine.begin() as c:  # a name only after creation (creation resolves it too)
        c.execute(text("UPDATE webhook_subscriptions SET url = 'http://stalling-dns.example:9/x' WHERE id = :i"),
                  {"i": sub})
    [first] = emit(orch, "local", 1)
    answer = threading.Event()
    real = socket_module.getaddrinfo

    def stalling_getaddrinfo(host, *a, **kw):
        if host == "stalling-dns.example":
            answer.wait(STALL_S)  # then it answers — long after the claim's lease (2 s) ran out
            return real("127.0.0.1", *a, **kw)
        return real(host, *a, **kw)

    monkeypatch.setattr(netguard.socket, "getaddrinfo", stalling_getaddrinfo)
    sent = []

    def send(url, secret, event, **kw) -> SendResult:
        sent.append(event["id"])
        return SendResult(True, 204)

    try:
        deliver_subscription(orch, sub, "w1", send=send)
    finally:
        answer.set()
    assert sent == []  # nothing was POSTed under a lease that had run out
    [state] = orch.list_webhooks("local")
    assert state["attempts"] == 1 and state["last_error"]["code"] == "timeout" and state["cursor"] < first
    with engine.connect() as c:
        lease = c.execute(text("SELECT lease_owner FROM webhook_subscriptions WHERE id = :i"), {"i": sub}).scalar()
    assert lease is None  # released with its backoff, not left to expire


@pytest.fixture()
def stalling_dns(monkeypatch):
    """``stalling-dns.example`` is answered only after STALL_S (or when the test ends)."""
    answer = threading.Event()
    real = socket_module.getaddrinfo

    def stalling_getaddrinfo(host, *a, **kw):
        if host == "stalling-dns.example":
            answer.wait(STALL_S)
            return real("127.0.0.1", *a, **kw)
        return real(host, *a, **kw)

    monkeypatch.setattr(netguard.socket, "getaddrinfo", stalling_getaddrinfo)
    yield
    answer.set()


def test_creating_a_subscription_waits_for_a_stalling_nameserver_no_longer_than_a_delivery(orch, stalling_dns):
    """``POST /webhooks`` resolves the URL in the API thread: a tenant's URL on a nameserver that
    never answers held that thread as long as the system resolver liked (tens of seconds each)."""
    orch.ensure_scope("local")
    started = time.monotonic()
    with pytest.raises(InvalidWebhook) as refused:
        orch.create_webhook("local", "http://stalling-dns.example:9/x")
    assert time.monotonic() - started < STALL_S / 2
    assert refused.value.code == "webhook_url_unresolvable"
    assert orch.list_webhooks("local") == []


def test_stalled_lookups_hold_a_bounded_pool_not_a_thread_each(orch, stalling_dns):
    """Each stalled delivery lookup used to leave a thread of its own behind until the resolver
    gave up; many subscriptions on one hostile nameserver piled them up. They now share a pool."""
    from app.bounded_dns import RESOLVER_THREADS

    for _ in range(3 * RESOLVER_THREADS):
        result = resolve_receiver("http://stalling-dns.example:9/x", (ipaddress.ip_network("127.0.0.0/8"),),
                                  timeout_s=0.05)
        assert isinstance(result, SendResult) and result.code == "timeout"
    stuck = [t for t in threading.enumerate() if "webhook" in t.name and "resolve" in t.name]
    assert 1 <= len(stuck) <= RESOLVER_THREADS, [t.name for t in stuck]
