"""``/api/v1/events``: the scope's events after an id — JSON long-poll, or Server-Sent Events
when the client asks for ``text/event-stream`` (resume with ``Last-Event-ID``).

Auth is the API's (:func:`app.api.context.protect`): a bearer token, or the local scope, or (token
mode) a browser session of this site's own page script, so the library page can follow the stream
with ``EventSource`` while another origin's page, even on another port of this host, cannot hold
the scope's stream slots with the user's cookie. Waiting streams are bounded per scope (DB-wide
slots under a lease) and per API process (each holds a server thread): over either bound is 429
``too_many_streams`` — but the process's streams are shared fairly among scopes
(:mod:`app.api.shares`): a scope below its fair share makes the oldest stream of the scope holding
the most end (after whole events; its client resumes from its cursor) and takes its thread.
Without authentication, another site's page may not open a stream or a long-poll either
(:mod:`app.api.hosts`): it could not read it, only hold the slots.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from flask import Response, request
from flask.views import MethodView

from app.api import schemas as S
from app.api.context import Blueprint, Credential, credential, protect, scope_id, services
from app.api.errors import ApiError, error_docs
from app.api.shares import FairShares, ShareRefused
from app.auth import Unauthorized
from app.orchestrator.errors import TooManyStreams

blp = protect(Blueprint("events", __name__, url_prefix="/api/v1/events", description="Events (outbox stream)"))

#: How long a stream opened at another scope's expense waits for the yielding stream's thread (it
#: notices within an ``event_poll_s``, or after the write it is blocked in): then 429 after all.
HANDOFF_S = 5.0


class _HeldStream:
    """The scope's DB-wide stream slot and this process's fair share of stream threads, released
    exactly once (also when a streamed response is closed before its first chunk).

    The scope's slot first: a newcomer that would make another scope's stream yield its share
    (:mod:`app.api.shares`) does so only once it is sure of its own slot."""

    def __init__(self, orch: Any, shares: FairShares, scope: str) -> None:
        s = orch.settings
        self._cm = orch.stream_slot(scope)
        self.slot = self._cm.__enter__()  # TooManyStreams: the scope's own streams are all open
        try:
            self.share = shares.acquire(scope, s.event_streams_per_process, preempt=True,
                                        handoff_s=max(HANDOFF_S, 3 * float(s.event_poll_s)))
        except ShareRefused:
            self._cm.__exit__(None, None, None)
            raise TooManyStreams("this API process serves as many live event streams as it may, and this scope"
                                 " holds its fair share of them") from None
        except BaseException:
            self._cm.__exit__(None, None, None)
            raise
        self._released = False

    def pause(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True (at once) when the stream must yield its share to another
        scope's: end it at this safe point, its client goes on from its cursor."""
        return self.share.stop.wait(seconds)

    def release(self) -> None:
        if not self._released:
            self._released = True
            try:
                self.share.release()  # the thread first: a waiting newcomer may take it at once
            finally:
                self._cm.__exit__(None, None, None)


class _CredentialCheck:
    """Asks again, at most every ``event_auth_check_s``, whether the credential that opened a
    waiting stream is still valid: a revoked or expired token, or a signed-out or expired browser
    session, ends the stream (the request's own check happened once, at its start)."""

    def __init__(self, orch: Any, engine: Any, cred: Credential | None) -> None:
        self.engine, self.cred, self.every = engine, cred, float(orch.settings.event_auth_check_s)
        self.next_at = time.monotonic() + self.every

    def still_valid(self) -> bool:
        if self.cred is None or time.monotonic() < self.next_at:
            return True
        self.next_at = time.monotonic() + self.every
        return self.cred.still_valid(self.engine)  # one indexed read


REVOKED = "the token or session of this stream was revoked or has expired"


def _wants_sse() -> bool:
    """Only an Accept header that names ``text/event-stream`` itself (EventSource does) gets a
    stream; ``*/*`` (curl, most clients) gets JSON."""
    named = {value.lower(): q for value, q in request.accept_mimetypes}
    sse = named.get("text/event-stream", 0)
    return sse > 0 and sse >= named.get("application/json", 0)


def _last_event_id() -> int | None:
    raw = request.headers.get("Last-Event-ID")
    if raw is None or raw.strip() == "":
        return None
    raw = raw.strip()
    # isascii: '²' (one latin-1 byte in a header) is a digit to isdigit(), not to int(); the length
    # bound keeps int() from a run of digits past its 4300
    if not S.is_event_id_text(raw):
        raise ApiError(422, "invalid_after", "Last-Event-ID must be an event id (a non-negative integer)")
    return int(raw)


@blp.route("")
class Events(MethodView):
    @blp.arguments(S.EventsArgsSchema, location="query")
    @blp.response(200, S.EventPageSchema, content_type="application/json")
    @blp.doc(responses=error_docs({401: "unauthorized", 422: "invalid_after / validation_error",
                                    429: "too_many_streams"}))
    def get(self, args):
        """The scope's events with id > ``after``, oldest first. ``wait`` > 0 long-polls until a first
        event arrives; ``Accept: text/event-stream`` streams them as Server-Sent Events instead
        (``id``, ``event`` = type, ``data`` = the event JSON; heartbeat comments while idle)."""
        svc = services()
        orch, scope = svc.orchestrator, scope_id()
        sse = _wants_sse()
        after = args["after"] or 0
        auth = _CredentialCheck(orch, svc.engine, credential())
        if sse:  # an EventSource reconnects to the same URL with Last-Event-ID: resume from there
            after = max(after, _last_event_id() or 0)
            return _sse_response(orch, svc.streams, auth, scope, after, args["limit"])
        events, expired = orch.read_events(scope, after, args["limit"])
        wait = min(float(args["wait"]), float(orch.settings.event_max_wait_s))
        if not events and expired is None and wait > 0:
            held = _HeldStream(orch, svc.streams, scope)
            try:
                events, expired = _long_poll(orch, held, auth, scope, after, args["limit"], wait)
            finally:
                held.release()
        return {"events": events, "last_id": _next_cursor(events, after, expired), "expired": expired}


def _next_cursor(events: list[dict], after: int, expired: dict | None) -> int:
    """Where the client goes on from: the page's last event; with none, past the pruned range when
    retention passed ``after`` — the page was read before the mark and ids of a scope are drawn in
    commit order, so nothing kept or to come lies at or below it (and the next read waits again
    instead of answering ``expired`` at once for ever)."""
    if events:
        return events[-1]["id"]
    return max(after, expired["through"]) if expired is not None else after


def _long_poll(orch: Any, held: _HeldStream, auth: _CredentialCheck, scope: str, after: int, limit: int,
               wait: float) -> tuple[list[dict], dict | None]:
    """Wait for a first event (or retention passing the cursor); the page and ``expired``."""
    s = orch.settings
    deadline = time.monotonic() + wait
    renew_at = time.monotonic() + s.event_heartbeat_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return [], None
        if held.pause(min(s.event_poll_s, remaining)):
            return [], None  # yielded to another scope's stream: an early empty page, the cursor unchanged
        if not auth.still_valid():
            raise Unauthorized(REVOKED)
        events, expired = orch.read_events(scope, after, limit)
        if events or expired is not None:
            return events, expired
        if time.monotonic() >= renew_at:
            renew_at = time.monotonic() + s.event_heartbeat_s
            if not held.slot.renew():
                return [], None


class _SseBody:
    """The streamed body: a generator plus a ``close`` that always frees the slots."""

    def __init__(self, chunks: Iterator[str], held: _HeldStream) -> None:
        self._chunks, self._held = chunks, held

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._chunks:
                yield chunk.encode("utf-8")
        finally:
            self._held.release()

    def close(self) -> None:
        self._held.release()


def sse_message(event: dict[str, Any]) -> str:
    """One event as an SSE message (the data is single-line JSON)."""
    return f"id: {event['id']}\nevent: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


def sse_expired(expired: dict[str, Any]) -> str:
    """Retention passed the stream's cursor: an ``events.expired`` message without an ``id`` line
    (the client's Last-Event-ID stays its own)."""
    return f"event: events.expired\ndata: {json.dumps(expired, separators=(',', ':'))}\n\n"


def _sse_chunks(orch: Any, held: _HeldStream, auth: _CredentialCheck, scope: str, after: int, limit: int
                ) -> Iterator[str]:
    s = orch.settings
    started = time.monotonic()
    beat_at = started + s.event_heartbeat_s
    yield f"retry: 2000\n: connected, after {after}\n\n"
    cursor, told = after, 0
    mark_at = started  # the prune mark is read at once, then every event_auth_check_s (a prune runs once a sweep)
    while time.monotonic() - started < s.event_stream_max_s:
        if held.share.stop.is_set():  # another scope's stream takes this one's share: end after whole events
            yield ": yielding to another tenant's stream; reconnect with Last-Event-ID\n\n"
            return
        if not auth.still_valid():  # EventSource reconnects and gets 401: it stops
            yield ": credential revoked or expired\n\n"
            return
        now = time.monotonic()
        with_mark = now >= mark_at
        if with_mark:
            mark_at = now + s.event_auth_check_s
        events, expired = orch.read_events(scope, cursor, limit, with_mark=with_mark)
        if expired is not None and expired["through"] > told:  # before the page: they may be missing before it
            told = expired["through"]
            yield sse_expired(expired)
        cursor = _next_cursor(events, cursor, expired)
        for event in events:
            yield sse_message(event)
            cursor = event["id"]
        now = time.monotonic()
        if now >= beat_at:  # a comment keeps proxies open and finds a gone client (the write fails)
            beat_at = now + s.event_heartbeat_s
            yield ": heartbeat\n\n"
            if not held.slot.renew():
                return
        if len(events) < limit:
            held.pause(s.event_poll_s)


def _sse_response(orch: Any, shares: FairShares, auth: _CredentialCheck, scope: str, after: int, limit: int
                  ) -> Response:
    held = _HeldStream(orch, shares, scope)  # 429 before any byte is streamed
    body = _SseBody(_sse_chunks(orch, held, auth, scope, after, limit), held)
    resp = Response(body, mimetype="text/event-stream")
    resp.headers["Cache-Control"] = "no-cache"
    resp.headers["X-Accel-Buffering"] = "no"  # nginx: pass each event through at once
    return resp
