"""GET /api/v1/events: JSON pages and long-poll, Server-Sent Events with Last-Event-ID resume,
scope isolation (bearer or browser session), bounded streams, invalid cursors."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from app.api import create_app
from app.auth import LocalScopeResolver
from app.orchestrator import Orchestrator
from app.web.sessions import SESSION_COOKIE, open_session
from tests.api.conftest import png_bytes, upload

OWN_PAGE = {"Sec-Fetch-Site": "same-origin", "Referer": "http://localhost/"}  # the library page's script


def _delete_two(client) -> list[str]:
    ids = []
    for color in ((1, 2, 3), (4, 5, 6)):
        image = upload(client, png_bytes(color)).get_json()["image"]
        assert client.delete(f"/api/v1/images/{image['id']}").status_code == 204
        ids.append(image["id"])
    return ids


def test_json_page_after_and_limit(client):
    ids = _delete_two(client)
    body = client.get("/api/v1/events").get_json()
    assert [e["type"] for e in body["events"]] == ["image.deleted", "image.deleted"]
    assert [e["image_id"] for e in body["events"]] == ids
    first = body["events"][0]
    assert set(first) == {"id", "type", "scope_id", "job_id", "image_id", "batch_id", "payload", "created_at"}
    assert first["scope_id"] == "local" and first["job_id"] is None and body["last_id"] == body["events"][-1]["id"]
    page = client.get(f"/api/v1/events?after={first['id']}&limit=1").get_json()
    assert [e["image_id"] for e in page["events"]] == ids[1:]
    empty = client.get(f"/api/v1/events?after={body['last_id']}").get_json()
    assert empty == {"events": [], "last_id": body["last_id"], "expired": None}


# the contract's ids are ASCII digits: not another script's digits ('٣'), '_' separators, a sign or
# spaces, all of which int() takes
@pytest.mark.parametrize("query", ["after=-1", "after=abc", "after=1.5", "after=99999999999999999999999",
                                   "after=%D9%A3", "after=5_000", "after=%2B5", "after=%205", "after=",
                                   "after=" + "9" * 5000, "limit=0", "limit=101", "wait=-1"])
def test_invalid_query_is_422(client, query):
    resp = client.get(f"/api/v1/events?{query}")
    assert resp.status_code == 422
    if query.startswith("after"):
        assert resp.get_json()["error"] == "invalid_after"


# '²' travels as one latin-1 byte (0xB2) in a header: str.isdigit() says True, int() refuses it;
# 5000 digits are more than int() converts
@pytest.mark.parametrize("value", ["x1", "²", "1²", "³", "9" * 5000, str(2**63)])
def test_invalid_last_event_id_is_422(client, value):
    resp = client.get("/api/v1/events", headers={"Accept": "text/event-stream", "Last-Event-ID": value})
    assert resp.status_code == 422 and resp.get_json()["error"] == "invalid_after"


def test_long_poll_returns_an_event_committed_while_waiting(client, orch):
    image = upload(client, png_bytes((9, 9, 9))).get_json()["image"]
    timer = threading.Timer(0.3, lambda: orch.delete_image("local", uuid.UUID(image["id"])))
    timer.start()
    try:
        body = client.get("/api/v1/events?after=0&wait=20").get_json()
    finally:
        timer.join()
    assert [e["image_id"] for e in body["events"]] == [image["id"]]


def test_long_poll_without_events_returns_empty_after_wait(client):
    body = client.get("/api/v1/events?after=0&wait=0.3").get_json()
    assert body == {"events": [], "last_id": 0, "expired": None}


@pytest.mark.parametrize("accept", ["*/*", "application/json", "application/json, text/event-stream;q=0.5", "text/*"])
def test_json_unless_the_client_names_event_stream(client, accept):
    resp = client.get("/api/v1/events", headers={"Accept": accept})
    assert resp.status_code == 200 and resp.mimetype == "application/json"


def _sse_events(resp, n: int, timeout: float = 20.0) -> list[dict]:
    """Read the streamed body until ``n`` events arrived (each parsed from its data line)."""
    out, buf, deadline = [], "", time.monotonic() + timeout
    chunks = iter(resp.response)
    while len(out) < n:
        assert time.monotonic() < deadline, "no SSE event in time"
        buf += next(chunks).decode()
        while "\n\n" in buf:
            message, buf = buf.split("\n\n", 1)
            fields = dict(line.split(": ", 1) for line in message.splitlines() if not line.startswith(":")
                          and ": " in line)
            if "data" in fields:
                event = json.loads(fields["data"])
                assert fields["id"] == str(event["id"]) and fields["event"] == event["type"]
                out.append(event)
    return out


def test_sse_streams_and_resumes_from_last_event_id(client, orch):
    ids = _delete_two(client)
    resp = client.get("/api/v1/events", headers={"Accept": "text/event-stream"}, buffered=False)
    assert resp.status_code == 200 and resp.mimetype == "text/event-stream"
    try:
        got = _sse_events(resp, 2)
        assert [e["image_id"] for e in got] == ids
        later = upload(client, png_bytes((7, 7, 7))).get_json()["image"]
        orch.delete_image("local", uuid.UUID(later["id"]))  # arrives on the open stream
        assert _sse_events(resp, 1)[0]["image_id"] == later["id"]
    finally:
        resp.close()
    resumed = client.get("/api/v1/events?after=0", buffered=False,  # the URL it started with, as EventSource does
                         headers={"Accept": "text/event-stream", "Last-Event-ID": str(got[0]["id"])})
    try:
        assert [e["image_id"] for e in _sse_events(resumed, 2)] == [ids[1], later["id"]]
    finally:
        resumed.close()


def test_streams_per_scope_are_bounded_and_freed_on_close(settings, engine, publisher, store):
    s = settings.replace(event_streams_per_scope=1)
    orch = Orchestrator(engine, s)
    app = create_app(scope_resolver=LocalScopeResolver(), settings=s, orchestrator=orch, engine=engine,
                     publisher=publisher, store=store, cursor_secret_key="test-secret")
    client = app.test_client()
    first = client.get("/api/v1/events", headers={"Accept": "text/event-stream"}, buffered=False)
    assert first.status_code == 200
    second = client.get("/api/v1/events", headers={"Accept": "text/event-stream"})
    assert second.status_code == 429 and second.get_json()["error"] == "too_many_streams"
    assert client.get("/api/v1/events?wait=1").status_code == 429  # a long-poll waits in a slot too
    assert client.get("/api/v1/events").status_code == 200  # a plain read does not
    first.close()
    third = client.get("/api/v1/events", headers={"Accept": "text/event-stream"}, buffered=False)
    assert third.status_code == 200
    third.close()


def test_each_scope_sees_only_its_events_by_token_or_browser_session(token_app, tokens, engine):
    client = token_app.test_client()
    alpha = {"Authorization": f"Bearer {tokens['alpha']}"}
    beta = {"Authorization": f"Bearer {tokens['beta']}"}
    image = upload(client, png_bytes((3, 3, 3)), headers=alpha).get_json()["image"]
    assert client.delete(f"/api/v1/images/{image['id']}", headers=alpha).status_code == 204
    assert [e["image_id"] for e in client.get("/api/v1/events", headers=alpha).get_json()["events"]] == [image["id"]]
    assert client.get("/api/v1/events", headers=beta).get_json()["events"] == []
    assert client.get("/api/v1/events").status_code == 401
    cookie, _ = open_session(engine, tokens["beta"], 60)
    client.set_cookie(SESSION_COOKIE, cookie)
    assert client.get("/api/v1/events", headers=OWN_PAGE).get_json() == {"events": [], "last_id": 0, "expired": None}
    client.set_cookie(SESSION_COOKIE, open_session(engine, tokens["alpha"], 60)[0])
    assert len(client.get("/api/v1/events", headers=OWN_PAGE).get_json()["events"]) == 1


# Another port of this host is same-site for cookies (the session cookie goes along), not same-origin.
OTHER_PORT = {"Origin": "http://localhost:8080", "Sec-Fetch-Site": "same-site", "Accept": "text/event-stream"}
OTHER_SITE = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site", "Accept": "text/event-stream"}


def _assert_foreign_refused_and_own_served(client, url, headers, slots, status, error):
    """More foreign opens than the scope has stream slots are all refused (``status``, ``error``),
    and the library page's own stream still opens beside them."""
    foreign = [client.get(url, headers=headers, buffered=False) for _ in range(slots + 1)]
    try:
        assert [(r.status_code, r.get_json()["error"]) for r in foreign] == [(status, error)] * (slots + 1)
        own = client.get("/api/v1/events", headers={**OWN_PAGE, "Accept": "text/event-stream"}, buffered=False)
        assert own.status_code == 200
        own.close()
    finally:
        for r in foreign:
            r.close()


def test_another_origins_page_cannot_hold_the_scopes_streams_with_the_session(token_app, tokens, engine, settings):
    client = token_app.test_client()
    client.set_cookie(SESSION_COOKIE, open_session(engine, tokens["alpha"], 600)[0])
    _assert_foreign_refused_and_own_served(client, "/api/v1/events", OTHER_PORT, settings.event_streams_per_scope,
                                           401, "unauthorized")


@pytest.mark.parametrize("wait", [None, "5"])
def test_auth_none_refuses_another_sites_streams_and_long_polls(client, settings, wait):
    query = f"?wait={wait}" if wait else ""
    headers = OTHER_SITE if wait is None else {k: v for k, v in OTHER_SITE.items() if k != "Accept"}
    _assert_foreign_refused_and_own_served(client, f"/api/v1/events{query}", headers, settings.event_streams_per_scope,
                                           403, "cross_site_request")


@pytest.fixture()
def checking_app(settings, engine, publisher, store):
    """Token mode, the stream's credential re-checked every 0.1 s."""
    from app.auth import TokenScopeResolver

    s = settings.replace(event_auth_check_s=0.1, event_stream_max_s=10.0)
    return create_app(scope_resolver=TokenScopeResolver(engine), settings=s, orchestrator=Orchestrator(engine, s),
                      engine=engine, publisher=publisher, store=store, cursor_secret_key="test-secret")


def _read_to_end(resp, timeout: float = 20.0) -> str:
    out, deadline = "", time.monotonic() + timeout
    for chunk in resp.response:
        out += chunk.decode()
        assert time.monotonic() < deadline, f"the stream did not end: {out!r}"
    return out


def _revoke(engine, how: str, cookie: str | None) -> None:
    from app.auth import revoke_token
    from app.web.sessions import close_session

    if how == "sign-out":
        assert close_session(engine, cookie)
    else:
        assert revoke_token(engine, "alpha-key", "alpha")


@pytest.mark.parametrize(("how", "by"), [("revoke", "token"), ("revoke", "session"), ("sign-out", "session")])
def test_an_open_stream_ends_when_its_credential_does(checking_app, tokens, engine, how, by):
    """The credential that opened a stream is asked again every ``event_auth_check_s``: revoking the
    token, or signing the browser session out, ends the stream (EventSource's reconnect gets 401)."""
    client = checking_app.test_client()
    headers = {"Accept": "text/event-stream"}
    cookie = None
    if by == "token":
        headers["Authorization"] = f"Bearer {tokens['alpha']}"
    else:
        cookie, _ = open_session(engine, tokens["alpha"], 600)
        client.set_cookie(SESSION_COOKIE, cookie)
        headers.update(OWN_PAGE)
    resp = client.get("/api/v1/events", headers=headers, buffered=False)
    assert resp.status_code == 200
    try:
        first = next(iter(resp.response)).decode()
        assert first.startswith("retry:")  # open, credential checked once
        _revoke(engine, how, cookie)
        rest = _read_to_end(resp)
    finally:
        resp.close()
    assert rest.endswith(": credential revoked or expired\n\n")
    assert client.get("/api/v1/events", headers=headers).status_code == 401


def test_a_long_poll_ends_401_when_its_token_is_revoked(checking_app, tokens, engine):
    client = checking_app.test_client()
    alpha = {"Authorization": f"Bearer {tokens['alpha']}"}
    got: list = []
    poll = threading.Thread(target=lambda: got.append(client.get("/api/v1/events?wait=10", headers=alpha)))
    poll.start()
    from sqlalchemy import text

    from tests.conftest import poll_until

    with engine.connect() as c:  # the long-poll waits in its stream slot
        poll_until(lambda: c.execute(text("SELECT count(*) FROM event_stream_slots")).scalar(), what="a waiting poll")
    _revoke(engine, "revoke", None)
    poll.join(20)
    assert got and got[0].status_code == 401 and got[0].get_json()["error"] == "unauthorized"
