"""Webhook deliveries against a real local HTTP receiver: signed, in order per subscription,
at-least-once with retries and a final ``failed``, SSRF refusal at subscription and at delivery,
deletion stops deliveries, scopes never mix, hostile receivers are bounded."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from app.orchestrator import Orchestrator
from app.orchestrator.errors import InvalidWebhook, NotFound, TooManyWebhooks
from app.orchestrator.store import events as events_q
from app.worker.webhook_sender import SendResult, send_event, verify
from app.worker.webhooks import deliver_subscription
from tests.conftest import poll_until
from tests.support.receiver import Receiver


@pytest.fixture()
def receiver():
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture()
def orch(engine, settings) -> Orchestrator:
    return Orchestrator(engine, settings.replace(
        webhook_allowed_networks="127.0.0.0/8", webhook_backoff_base_s=0.01, webhook_backoff_max_s=0.02,
        webhook_timeout_s=1.0, webhook_max_attempts=3,
    ))


def emit(orch, scope: str, n: int) -> list[int]:
    for i in range(n):
        with orch.engine.begin() as c:
            events_q.stage_event_txn(c, scope, "batch.progress", {"n": i})
    with orch.engine.connect() as c:
        return [r["id"] for r in events_q.events_after_txn(c, scope, 0, 1000)][-n:]


def emit_deleted(orch) -> int:
    with orch.engine.begin() as c:
        events_q.stage_event_txn(c, "local", "image.deleted", {"image_id": None})
    return orch.last_event_id("local")


def drain(orch, until, timeout: float = 30.0) -> None:
    """Run the lane in-process (poll → hints → deliver) until ``until()`` holds."""
    def step():
        for hint in orch.webhook_hints():
            more = deliver_subscription(orch, hint.task_id, "test-worker")
            for h in more:
                deliver_subscription(orch, h.task_id, "test-worker")
        return until()

    poll_until(step, timeout=timeout, interval=0.01, what="deliveries")



def test_deliveries_are_signed_ordered_and_carry_the_event(orch, receiver):
    orch.ensure_scope("local")
    emit(orch, "local", 2)  # before the subscription: not delivered
    hook, secret = orch.create_webhook("local", receiver.url("/ok"))
    assert secret.startswith("whsec_") and "secret" not in hook
    ids = emit(orch, "local", 5)
    drain(orch, lambda: len(receiver.at("/ok")) >= 5)
    got = receiver.at("/ok")
    assert [r.event["id"] for r in got] == ids
    for r in got:
        assert verify(secret, r.headers["Memeflow-Signature"], r.body)
        assert not verify("whsec_wrong", r.headers["Memeflow-Signature"], r.body)
        assert r.headers["Idempotency-Key"] == r.headers["Memeflow-Event-Id"] == str(r.event["id"])
        assert r.headers["Memeflow-Event-Type"] == "batch.progress" and r.event["scope_id"] == "local"
        assert r.headers["Memeflow-Signature"].startswith(f"t={r.headers['Memeflow-Timestamp']},v1=")
    assert orch.list_webhooks("local")[0]["delivered_count"] == 5


def test_retries_after_500s_in_order_without_extra_duplicates(orch, receiver):
    orch.ensure_scope("local")
    orch.create_webhook("local", receiver.url("/fail/2"))
    ids = emit(orch, "local", 4)
    drain(orch, lambda: sum(r.status == 200 for r in receiver.at("/fail")) >= 4)
    got = receiver.at("/fail")
    assert [r.event["id"] for r in got if r.status == 200] == ids  # each succeeded exactly once, in order
    seq = [r.event["id"] for r in got]
    assert seq == sorted(seq)  # the next event only after the previous one succeeded
    assert all(sum(1 for r in got if r.event["id"] == i and r.status == 500) == 2 for i in ids)


def test_an_event_that_keeps_failing_is_recorded_failed_and_the_next_goes_out(orch, receiver, engine):
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", receiver.url("/failfirst/3"))  # max_attempts = 3: event 1 gives up
    ids = emit(orch, "local", 2)
    drain(orch, lambda: any(r.status == 200 for r in receiver.at("/fail")))
    with engine.connect() as c:
        failed = c.execute(text("SELECT event_id, attempts, error->>'code' FROM webhook_failures")).all()
    assert failed == [(ids[0], 3, "http_error")]
    assert [r.event["id"] for r in receiver.at("/fail") if r.status == 200][0] == ids[1]
    state = orch.list_webhooks("local")[0]
    assert state["failed_count"] == 1 and state["cursor"] >= ids[0]
    assert orch.recent_webhook_failures()[0]["event_id"] == ids[0]
    html = _ops_html(orch)  # visible to the operator
    assert 'class="webhook-failed"' in html and "http_error" in html and receiver.url("/failfirst/3")[:40] in html


def test_a_receiver_answering_unstorable_bytes_fails_its_event_with_a_stable_code(orch, receiver, engine):
    """A receiver that answers NUL and control bytes instead of HTTP: the parse error quotes them,
    and a NUL in the recorded error made PostgreSQL refuse the failure's own write (jsonb stores no
    \\u0000) — the delivery raised out of the worker, the subscription stayed leased, and every
    lease recovery repeated it: the event never failed and nothing after it was delivered."""
    orch.ensure_scope("local")
    orch.create_webhook("local", receiver.url("/garbage"))  # max_attempts = 3
    [event_id] = emit(orch, "local", 1)
    with engine.connect() as c:
        failed = lambda: c.execute(text("SELECT event_id, attempts, error FROM webhook_failures")).all()  # noqa: E731
        drain(orch, lambda: bool(failed()))
        [(got_event, attempts, error)] = failed()
    assert (got_event, attempts, error["code"]) == (event_id, 3, "connection_error")
    assert "\x00" not in error["message"] and "BOGUS" in error["message"]
    state = orch.list_webhooks("local")[0]
    assert state["failed_count"] == 1 and state["cursor"] >= event_id
    assert state["last_error"]["code"] == "connection_error"


def _ops_html(orch) -> str:
    from app.api import create_app
    from app.auth import LocalScopeResolver
    from app.orchestrator import RecordingPublisher
    from app.storage import FileStore

    app = create_app(scope_resolver=LocalScopeResolver(), settings=orch.settings, orchestrator=orch,
                     engine=orch.engine, publisher=RecordingPublisher(), store=FileStore(orch.settings.storage_path),
                     cursor_secret_key="test-secret")
    resp = app.test_client().get("/ops/")
    assert resp.status_code == 200
    return resp.get_data(as_text=True)


@pytest.mark.parametrize(("url", "code"), [
    ("ftp://example.com/x", "invalid_webhook_url"),
    ("javascript:alert(1)", "invalid_webhook_url"),
    ("http://", "invalid_webhook_url"),
    ("http://user:pw@example.com/", "invalid_webhook_url"),
    ("http://example.com/" + "a" * 2100, "webhook_url_too_long"),
    ("http://127.0.0.1:9/x", "webhook_url_forbidden"),
    ("http://localhost/x", "webhook_url_forbidden"),
    ("http://[::1]/x", "webhook_url_forbidden"),
    ("http://169.254.169.254/latest/meta-data", "webhook_url_forbidden"),
    ("http://10.1.2.3/", "webhook_url_forbidden"),
    ("http://192.168.0.1/", "webhook_url_forbidden"),
    ("http://[::ffff:127.0.0.1]/", "webhook_url_forbidden"),
    ("http://0.0.0.0/", "webhook_url_forbidden"),
    ("http://does-not-exist.invalid/", "webhook_url_unresolvable"),
])
def test_subscription_refuses_bad_and_forbidden_urls(engine, settings, url, code):
    orch = Orchestrator(engine, settings)  # no allowed networks
    with pytest.raises(InvalidWebhook) as err:
        orch.create_webhook("local", url)
    assert err.value.code == code
    assert orch.list_webhooks("local") == []


def test_delivery_rechecks_the_address(orch, receiver, engine, settings):
    """Allowed when subscribed, forbidden at delivery (what DNS rebinding would look like): nothing is sent."""
    orch.ensure_scope("local")
    orch.create_webhook("local", receiver.url("/ok"))
    emit(orch, "local", 1)
    strict = Orchestrator(engine, orch.settings.replace(webhook_allowed_networks=None))
    drain(strict, lambda: strict.list_webhooks("local")[0]["last_error"] is not None)
    assert strict.list_webhooks("local")[0]["last_error"]["code"] == "webhook_url_forbidden"
    assert receiver.requests == []


def test_deleting_a_subscription_stops_its_deliveries(orch, receiver):
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", receiver.url("/ok"))
    emit(orch, "local", 1)
    drain(orch, lambda: len(receiver.at("/ok")) == 1)
    claim_holder = orch.create_webhook("local", receiver.url("/ok?second"))[0]
    emit(orch, "local", 1)
    claim = orch.claim_webhook(uuid.UUID(claim_holder["id"]), "w")
    orch.delete_webhook("local", hook["id"])
    orch.delete_webhook("local", claim_holder["id"])  # while claimed: its in-flight claim is fenced
    assert orch.webhook_delivered(claim, 10**9) is False
    emit(orch, "local", 2)
    assert orch.webhook_hints() == []
    time.sleep(0.1)
    assert len(receiver.at("/ok")) == 1
    with pytest.raises(NotFound):
        orch.delete_webhook("local", hook["id"])


def test_no_delivery_starts_after_the_delete_returned(orch, receiver):
    """A claim between two deliveries reads its next event through the fence: once the DELETE
    committed (the API's 204), the claim finds nothing and sends nothing more."""
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", receiver.url("/ok"))
    emit(orch, "local", 3)
    recorded, deleted = orch.webhook_delivered, []

    def delivered_then_deleted(claim, event_id):
        ok = recorded(claim, event_id)
        if not deleted:  # the user's DELETE commits after the first delivery was recorded
            orch.delete_webhook("local", hook["id"])
            deleted.append(event_id)
        return ok

    orch.webhook_delivered = delivered_then_deleted
    deliver_subscription(orch, uuid.UUID(hook["id"]), "w")
    assert len(receiver.at("/ok")) == 1


def test_a_delete_waits_for_the_delivery_in_flight(orch, engine):
    """The delivery holds its subscription row FOR KEY SHARE across the POST: a DELETE cannot commit
    (and the API cannot answer 204) while a delivery to it is in flight."""
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", "http://127.0.0.1:9/never")
    emit(orch, "local", 1)
    sqlstates: list[str | None] = []

    def send(url, secret, event, **kw) -> SendResult:
        with engine.connect() as c:
            tx = c.begin()
            try:
                c.execute(text("SET LOCAL lock_timeout = '50ms'"))
                c.execute(text("DELETE FROM webhook_subscriptions WHERE id = :id"), {"id": hook["id"]})
                sqlstates.append(None)  # deleted mid-delivery (rolled back below)
            except OperationalError as exc:
                sqlstates.append(exc.orig.sqlstate)
            finally:
                tx.rollback()
        return SendResult(True, 200)

    deliver_subscription(orch, uuid.UUID(hook["id"]), "w", send=send)
    assert sqlstates == ["55P03"]  # lock_not_available: the DELETE had to wait for the delivery
    assert orch.list_webhooks("local")[0]["delivered_count"] == 1


def test_one_scopes_events_never_reach_another_scopes_subscription(orch, receiver):
    for s in ("alpha", "beta"):
        orch.ensure_scope(s)
    orch.create_webhook("alpha", receiver.url("/ok/alpha"))
    orch.create_webhook("beta", receiver.url("/ok/beta"))
    with pytest.raises(NotFound):
        orch.delete_webhook("beta", orch.list_webhooks("alpha")[0]["id"])
    a = emit(orch, "alpha", 3)
    b = emit(orch, "beta", 2)
    drain(orch, lambda: len(receiver.at("/ok/alpha")) == 3 and len(receiver.at("/ok/beta")) == 2)
    assert [r.event["id"] for r in receiver.at("/ok/alpha")] == a
    assert [r.event["id"] for r in receiver.at("/ok/beta")] == b
    assert {r.event["scope_id"] for r in receiver.at("/ok/alpha")} == {"alpha"}


def test_event_types_filter_and_limits(orch, receiver):
    orch.ensure_scope("local")
    with pytest.raises(InvalidWebhook) as err:
        orch.create_webhook("local", receiver.url("/ok"), ["job.exploded"])
    assert err.value.code == "invalid_event_type"
    orch.create_webhook("local", receiver.url("/ok"), ["image.deleted"])
    emit(orch, "local", 2)  # batch.progress: not subscribed
    assert orch.webhook_hints() == []
    emit(orch, "local", 50)
    orch.sweep()  # the filtered subscription's cursor skips what it does not take
    assert orch.list_webhooks("local")[0]["cursor"] == orch.last_event_id("local")
    image_event = emit_deleted(orch)
    drain(orch, lambda: receiver.at("/ok"))
    assert [r.event["id"] for r in receiver.at("/ok")] == [image_event]
    small = Orchestrator(orch.engine, orch.settings.replace(webhooks_per_scope=1))
    with pytest.raises(TooManyWebhooks):
        small.create_webhook("local", receiver.url("/ok"))


@pytest.mark.parametrize(("path", "code"), [("/hang", "timeout"), ("/redirect", "redirect_refused"),
                                            ("/down", "http_error")])
def test_hostile_receivers_fail_within_the_deadline(receiver, path, code):
    event = {"id": 1, "type": "batch.progress"}
    started = time.monotonic()
    result = send_event(receiver.url(path), "whsec_x", event, timeout_s=0.5, max_response_bytes=1024,
                        networks=_loopback())
    assert not result.ok and result.code == code
    assert time.monotonic() - started < 5  # bounded by the deadline (generous for a busy box)
    if path == "/redirect":
        assert receiver.at("/ok") == []  # not followed


def test_a_huge_answer_is_read_only_up_to_the_bound(receiver):
    started = time.monotonic()
    result = send_event(receiver.url("/huge"), "whsec_x", {"id": 1, "type": "batch.progress"}, timeout_s=5,
                        max_response_bytes=64 * 1024, networks=_loopback())
    assert result.ok and result.status == 200
    assert time.monotonic() - started < 5


def _loopback():
    from app.netguard import allowed_networks

    return allowed_networks("127.0.0.0/8")


def test_racing_claims_admit_one_and_a_dead_claims_events_are_redelivered(engine, settings, receiver):
    import threading

    orch = Orchestrator(engine, settings.replace(webhook_allowed_networks="127.0.0.0/8", webhook_timeout_s=0.2,
                                                 webhook_lease_s=0.5))
    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", receiver.url("/ok"))
    ids = emit(orch, "local", 3)
    sub = uuid.UUID(hook["id"])
    won: list = []
    barrier = threading.Barrier(8)

    def race(i: int) -> None:
        barrier.wait()
        claim = orch.claim_webhook(sub, f"w{i}")
        if claim is not None:
            won.append(claim)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    dead = won[0]  # its worker "dies" holding the claim: nothing is sent, nothing recorded
    assert orch.webhook_hints() == []  # leased: nobody else takes it yet
    drain(orch, lambda: len(receiver.at("/ok")) >= 3)  # after the lease expires, a new claim delivers all
    assert [r.event["id"] for r in receiver.at("/ok")] == ids
    assert orch.webhook_delivered(dead, ids[0]) is False  # the dead claim's late write is fenced out


def test_https_delivery_to_the_checked_address_verifies_the_certificate(tmp_path, monkeypatch):
    import ssl
    import subprocess
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    got: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            got.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_address[1]}/hook"
    event = {"id": 7, "type": "batch.progress"}
    try:
        untrusted = send_event(url, "whsec_x", event, timeout_s=5, max_response_bytes=1024, networks=_loopback())
        assert not untrusted.ok and "CERTIFICATE_VERIFY_FAILED" in untrusted.message and got == []
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the receiver's CA is trusted now
        trusted = send_event(url, "whsec_x", event, timeout_s=5, max_response_bytes=1024, networks=_loopback())
        assert trusted.ok and len(got) == 1
    finally:
        server.shutdown()
        server.server_close()


def test_a_slow_name_resolution_holds_no_lock_a_delete_waits_for(orch, engine, monkeypatch):
    """The receiver's name is resolved and checked before the subscription row is share-locked:
    a resolver that hangs (a dead nameserver) delays that delivery, never a DELETE — which then
    fences the delivery out: nothing is sent."""
    import socket as socket_module

    from app import netguard

    orch.ensure_scope("local")
    hook, _ = orch.create_webhook("local", "http://127.0.0.1:9/x")
    with engine.begin() as c:  # a name only after creation (creation resolves it too)
        c.execute(text("UPDATE webhook_subscriptions SET url = 'http://slow-dns.example:9/x' WHERE id = :i"),
                  {"i": hook["id"]})
    emit(orch, "local", 1)
    resolving, answer = threading.Event(), threading.Event()
    real = socket_module.getaddrinfo

    def slow_getaddrinfo(host, *a, **kw):
        if host == "slow-dns.example":
            resolving.set()
            answer.wait(30)
            return real("127.0.0.1", *a, **kw)
        return real(host, *a, **kw)

    monkeypatch.setattr(netguard.socket, "getaddrinfo", slow_getaddrinfo)
    sent = []

    def send(url, secret, event, **kw) -> SendResult:
        sent.append(event["id"])
        return send_event(url, secret, event, **kw)

    delivery = threading.Thread(target=deliver_subscription, args=(orch, uuid.UUID(hook["id"]), "w"),
                                kwargs={"send": send})
    delivery.start()
    try:
        assert resolving.wait(10)
        orch.delete_webhook("local", hook["id"])  # answers while the name is still being resolved
    finally:
        answer.set()
        delivery.join()
    assert sent == [] and orch.list_webhooks("local") == []


def test_a_delete_that_outwaits_a_delivery_in_flight_is_a_stable_conflict(orch, engine, monkeypatch):
    """A delivery holds the row past what a DELETE waits (webhook_timeout_s + a margin): the DELETE
    answers WebhookDeliveryInFlight (409 webhook_delivery_in_flight), not a database error."""
    from app.orchestrator.errors import WebhookDeliveryInFlight
    from app.orchestrator.store import webhooks as webhooks_q

    monkeypatch.setattr(webhooks_q, "DELETE_WAIT_MARGIN_S", 0.0)
    fast = Orchestrator(engine, orch.settings.replace(webhook_timeout_s=0.2))
    fast.ensure_scope("local")
    hook, _ = fast.create_webhook("local", "http://127.0.0.1:9/x")
    with engine.connect() as c, c.begin():  # a delivery in flight: the row share-locked
        c.execute(text("SELECT 1 FROM webhook_subscriptions WHERE id = :i FOR KEY SHARE"), {"i": hook["id"]})
        with pytest.raises(WebhookDeliveryInFlight) as err:
            fast.delete_webhook("local", hook["id"])
    assert (err.value.code, err.value.status) == ("webhook_delivery_in_flight", 409)
    fast.delete_webhook("local", hook["id"])  # once it ended, the retry deletes
    assert fast.list_webhooks("local") == []
