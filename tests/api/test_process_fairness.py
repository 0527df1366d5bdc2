"""Tenants share an API process's threads fairly, over real server threads (werkzeug, threaded).

* Live event streams: when the process's streams are all held and a scope holding fewer than its
  fair share (capacity // scopes holding, at least 1) opens one, the oldest stream of the scope
  holding the most ends (an SSE response ends after its last whole event, a long-poll answers its
  empty page early) and the newcomer is served — before, a third tenant got 429 for as long as two
  others held the process's streams. The ended stream resumes exactly from its Last-Event-ID.
* Searches: at most ``searches_per_process`` run at once in a process (429 ``too_many_searches``
  over it), and a scope holding its fair share may not take a slot a refused scope below its share
  is waiting for — before, four tenants' searches (and streams) could hold every thread.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import text
from werkzeug.serving import make_server

from app.api import create_app
from app.auth import TokenScopeResolver, create_scope, create_token
from app.db.enums import EventType
from app.orchestrator import Orchestrator
from app.orchestrator.store import events as events_q
from app.search import service as text_search
from tests.conftest import poll_until

SCOPES = ("alpha", "beta", "gamma")


@pytest.fixture()
def three_tokens(engine) -> dict[str, str]:
    out = {}
    for scope in SCOPES:
        create_scope(engine, scope)
        _, token = create_token(engine, scope, f"{scope}-key")
        out[scope] = token
    return out


@contextmanager
def _serving(settings, engine, publisher, store, **limits) -> Iterator[tuple[int, object]]:
    # a short heartbeat finds a closed test connection quickly (the write fails), so no stream
    # outlives its test
    s = settings.replace(event_heartbeat_s=0.5, event_max_wait_s=600.0, **limits)
    app = create_app(scope_resolver=TokenScopeResolver(engine), settings=s, orchestrator=Orchestrator(engine, s),
                     engine=engine, publisher=publisher, store=store, cursor_secret_key="test-secret")
    server = make_server("127.0.0.1", 0, app, threaded=True)
    serve = threading.Thread(target=server.serve_forever, daemon=True)
    serve.start()
    try:
        yield server.server_port, app
    finally:
        server.shutdown()
        server.server_close()


def _auth(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


class _Stream:
    """One SSE response read over its own connection."""

    def __init__(self, port: int, token: str, last_id: int | None = None) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = _auth(token, Accept="text/event-stream")
        if last_id is not None:
            headers["Last-Event-ID"] = str(last_id)
        self.conn.request("GET", "/api/v1/events?after=0", headers=headers)
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.body = self.resp.read() if self.status != 200 else b""

    def _message(self) -> str | None:
        """The next message (comments included), or None at the end of the response."""
        lines = []
        while True:
            line = self.resp.readline()
            if not line:
                return None
            if line in (b"\n", b"\r\n"):
                return "".join(lines)
            lines.append(line.decode())

    def events(self, n: int) -> list[dict]:
        out, deadline = [], time.monotonic() + 30
        while len(out) < n:
            assert time.monotonic() < deadline, "no SSE event in time"
            message = self._message()
            assert message is not None, f"the stream ended after {out}"
            out.extend(_events_of(message))
        return out

    def to_end(self) -> list[dict]:
        """Read until the response ends (the socket timeout bounds each read): its events."""
        out = []
        while (message := self._message()) is not None:
            out.extend(_events_of(message))
        return out

    def close(self) -> None:
        self.resp.close()  # the response holds the socket too
        self.conn.close()


def _events_of(message: str) -> list[dict]:
    fields = dict(line.rstrip("\r\n").split(": ", 1) for line in message.splitlines()
                  if not line.startswith(":") and ": " in line)
    if "data" not in fields or "id" not in fields:
        return []
    return [json.loads(fields["data"])]


def _emit(engine, scope: str, n: int) -> None:
    for _ in range(n):
        with engine.begin() as conn:
            events_q.stage_event_txn(conn, scope, EventType.IMAGE_DELETED.value, {})


def _get(port: int, path: str, token: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path, headers=_auth(token))
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def _streams_held(engine) -> int:
    """Live streams of every scope (their leased slot rows; a stream frees its process share first)."""
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM event_stream_slots")).scalar_one()


def test_a_third_tenant_gets_a_stream_from_the_tenant_holding_most_and_the_ended_one_resumes(
        settings, engine, publisher, store, three_tokens):
    _emit(engine, "alpha", 2)
    with _serving(settings, engine, publisher, store, event_streams_per_process=4) as (port, app):
        alpha_old = _Stream(port, three_tokens["alpha"])
        first = alpha_old.events(2)
        alpha_new = _Stream(port, three_tokens["alpha"])
        betas = [_Stream(port, three_tokens["beta"]) for _ in range(2)]
        opened = [alpha_old, alpha_new, *betas]
        try:
            assert [s.status for s in opened] == [200] * 4
            gamma = _Stream(port, three_tokens["gamma"])  # before: 429 too_many_streams, for as long as they held
            opened.append(gamma)
            assert gamma.status == 200, gamma.body
            _emit(engine, "alpha", 1)  # committed while alpha's oldest stream ends: it may see it or not
            seen = first + alpha_old.to_end()  # the oldest stream of (tied) most-holding alpha ended ...
            streamed = alpha_new.events(3)  # ... its other one still streams
            _emit(engine, "gamma", 1)
            assert len(gamma.events(1)) == 1
            # alpha is at its share now (4 // 3 = 1): a reconnect is refused, nobody's stream ends
            again = _Stream(port, three_tokens["alpha"], last_id=seen[-1]["id"])
            assert again.status == 429 and json.loads(again.body)["error"] == "too_many_streams"
            gamma.close()
            poll_until(lambda: _streams_held(engine) == 3, what="gamma's stream freed")
            _emit(engine, "alpha", 2)
            resumed = _Stream(port, three_tokens["alpha"], last_id=seen[-1]["id"])  # EventSource's reconnect
            opened.append(resumed)
            assert resumed.status == 200
            every = [e["id"] for e in streamed + alpha_new.events(2)]  # alpha's 5 events, as a stream saw them
            got = resumed.events(5 - len(seen))
            assert [e["id"] for e in seen + got] == every  # exactly once, in order, nothing skipped
        finally:
            for s in opened:
                s.close()
            poll_until(lambda: _streams_held(engine) == 0, what="every stream gave its share back")


def test_a_long_poll_of_the_tenant_holding_most_answers_early_for_a_newcomer(
        settings, engine, publisher, store, three_tokens):
    with _serving(settings, engine, publisher, store, event_streams_per_process=2) as (port, app):
        answer: list[tuple[int, dict]] = []
        poll = threading.Thread(target=lambda: answer.append(
            _get(port, "/api/v1/events?after=0&wait=300", three_tokens["alpha"])))
        poll.start()
        alpha_sse = None
        beta = None
        try:
            poll_until(lambda: _streams_held(engine) == 1, what="alpha's long-poll waits")
            alpha_sse = _Stream(port, three_tokens["alpha"])
            assert alpha_sse.status == 200
            beta = _Stream(port, three_tokens["beta"])  # before: 429 for up to the long-poll's 300 s
            assert beta.status == 200, beta.body
            poll.join(60)
            assert not poll.is_alive(), "alpha's oldest stream, the long-poll, did not answer early"
            assert answer == [(200, {"events": [], "last_id": 0, "expired": None})]  # resume from 0: nothing lost
        finally:
            for s in (alpha_sse, beta):
                if s is not None:
                    s.close()
            poll.join(60)
            poll_until(lambda: _streams_held(engine) == 0, what="every stream gave its share back")


def test_searches_are_bounded_per_process_and_a_refused_tenant_gets_the_next_free_one(
        settings, engine, publisher, store, three_tokens, monkeypatch):
    real = text_search.search_text
    gates = {"alpha": threading.Semaphore(0)}
    inside = threading.Semaphore(0)

    def held_for_alpha(engine_, provider, scope, *args, **kwargs):
        if scope in gates:
            inside.release()
            assert gates[scope].acquire(timeout=60)
        return real(engine_, provider, scope, *args, **kwargs)

    monkeypatch.setattr(text_search, "search_text", held_for_alpha)
    with _serving(settings, engine, publisher, store, searches_per_process=2, searches_per_scope=2) as (port, app):
        answers: list[int] = []

        def alpha_search() -> None:
            answers.append(_get(port, "/api/v1/search/text?q=cat", three_tokens["alpha"])[0])

        held = [threading.Thread(target=alpha_search) for _ in range(2)]
        for t in held:
            t.start()
        try:
            for _ in held:
                assert inside.acquire(timeout=30)
            status, body = _get(port, "/api/v1/search/text?q=cat", three_tokens["beta"])
            assert (status, body["error"]) == (429, "too_many_searches")  # before: a third thread taken
            gates["alpha"].release()  # one of alpha's searches answers: one slot is free
            poll_until(lambda: answers == [200], what="alpha's first search answered")
            # alpha holds 1 of 2 — its share among alpha and beta, who was refused and waits for it
            status, body = _get(port, "/api/v1/search/text?q=cat", three_tokens["alpha"])
            assert (status, body["error"]) == (429, "too_many_searches")
            assert _get(port, "/api/v1/search/text?q=cat", three_tokens["beta"])[0] == 200
        finally:
            for _ in held:
                gates["alpha"].release()
            for t in held:
                t.join(60)
        assert answers == [200, 200]
        assert app.extensions["memeflow"].searches.held() == 0
        assert _get(port, "/api/v1/search/text?q=cat", three_tokens["gamma"])[0] == 200
