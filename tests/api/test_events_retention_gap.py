"""A stream reader whose cursor retention has passed is told (``expired``), never served the next
kept events as if nothing were missing: the prune records each scope's highest deleted id
(``event_prune_marks``, in the same statement), and a read from a cursor below it says so — in the
JSON page, the long-poll and as an ``events.expired`` SSE message."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

from sqlalchemy import text

from app.orchestrator import Orchestrator
from app.orchestrator.events import prune_events
from app.orchestrator.store import events as events_q
from tests.db.test_webhooks import emit


def _prune_everything(orch: Orchestrator, limit: int | None = None) -> int:
    """The sweep's prune past retention (events are stamped by the database's clock)."""
    later = Orchestrator(orch.engine, orch.settings,
                         clock=lambda: datetime.now(timezone.utc) + timedelta(seconds=orch.settings.events_retention_s + 86400))
    if limit is None:
        return prune_events(later)
    with orch.engine.begin() as conn:
        return events_q.prune_events_txn(conn, later.now() - timedelta(seconds=orch.settings.events_retention_s),
                                         limit, later.now()).affected


def _marks(engine) -> dict[str, int]:
    with engine.connect() as c:
        return dict(c.execute(text("SELECT scope_id, pruned_through FROM event_prune_marks")).all())


def test_the_prune_marks_each_scope_with_its_highest_deleted_id(orch, engine):
    orch.ensure_scope("local")
    orch.ensure_scope("other")
    local = emit(orch, "local", 2)
    other = emit(orch, "other", 1)
    later_local = emit(orch, "local", 1)
    assert _prune_everything(orch, limit=2) == 2  # the two oldest: both of local's first two
    assert _marks(engine) == {"local": local[1]}
    assert _prune_everything(orch) == 2
    assert _marks(engine) == {"local": later_local[0], "other": other[0]}
    assert _prune_everything(orch) == 0  # nothing left: the marks stay where they are
    assert _marks(engine) == {"local": later_local[0], "other": other[0]}


def test_a_json_read_from_a_cursor_retention_passed_says_so(client, orch):
    orch.ensure_scope("local")
    seen, *unseen = emit(orch, "local", 3)  # the client read the first, then went away for longer than retention
    assert _prune_everything(orch) == 3
    # nothing kept after the cursor: a long-poll answers at once, there is something to tell
    started = time.monotonic()
    polled = client.get(f"/api/v1/events?after={seen}&wait=30").get_json()
    assert time.monotonic() - started < 25  # it did not wait out its 30 s
    assert (polled["expired"]["after"], polled["expired"]["through"]) == (seen, unseen[-1])
    # it goes on past the pruned range: the next long-poll from there waits, it does not spin
    assert polled["events"] == [] and polled["last_id"] == unseen[-1]
    calm = client.get(f"/api/v1/events?after={polled['last_id']}&wait=0.3").get_json()
    assert calm == {"events": [], "last_id": unseen[-1], "expired": None}
    newer = emit(orch, "local", 1)[0]
    body = client.get(f"/api/v1/events?after={seen}").get_json()
    assert [e["id"] for e in body["events"]] == [newer] and body["last_id"] == newer
    expired = body["expired"]
    assert (expired["code"], expired["after"], expired["through"]) == ("events_expired", seen, unseen[-1])
    assert "may be missing" in expired["message"]
    # a cursor at or past the mark, or 0 ("from the oldest kept"), has missed nothing
    for after in (unseen[-1], newer, 0):
        assert client.get(f"/api/v1/events?after={after}").get_json()["expired"] is None


def test_another_scopes_prune_tells_this_scope_nothing(client, orch):
    orch.ensure_scope("local")
    orch.ensure_scope("other")
    emit(orch, "other", 2)
    assert _prune_everything(orch) == 2
    mine = emit(orch, "local", 2)
    body = client.get(f"/api/v1/events?after={mine[0]}").get_json()
    assert body["expired"] is None and [e["id"] for e in body["events"]] == mine[1:]


def _sse_messages(resp, n: int, timeout: float = 20.0) -> list[dict[str, str]]:
    """The first ``n`` messages with data, as their fields (comments skipped)."""
    out, buf, deadline = [], "", time.monotonic() + timeout
    chunks = iter(resp.response)
    while len(out) < n:
        assert time.monotonic() < deadline, "no SSE message in time"
        buf += next(chunks).decode()
        while "\n\n" in buf and len(out) < n:
            message, buf = buf.split("\n\n", 1)
            fields = dict(line.split(": ", 1) for line in message.splitlines()
                          if not line.startswith(":") and ": " in line)
            if "data" in fields:
                out.append(fields)
    return out


def test_a_resumed_stream_is_told_before_the_kept_events(client, orch):
    orch.ensure_scope("local")
    seen, *unseen = emit(orch, "local", 2)
    assert _prune_everything(orch) == 2
    newer = emit(orch, "local", 1)[0]
    resp = client.get("/api/v1/events", buffered=False,
                      headers={"Accept": "text/event-stream", "Last-Event-ID": str(seen)})
    try:
        told, event = _sse_messages(resp, 2)
    finally:
        resp.close()
    assert told["event"] == "events.expired" and "id" not in told  # the client's Last-Event-ID stays its own
    assert json.loads(told["data"])["through"] == unseen[-1]
    assert event["event"] == "batch.progress" and event["id"] == str(newer)
