"""The library page's live progress over Server-Sent Events, in headless Chromium with real workers.

The event stream (``GET /api/v1/events``, issue 20 part 3) is built on another branch. Until it is
merged, this test mounts a stand-in that speaks the same contract — JSON ``{events, last_id}`` and
SSE (``id:``, ``event: job.succeeded``, ``data: {...}``) — from the jobs table, so that the page's
EventSource path runs. Once the real endpoint is there it takes precedence (its rule is registered
first) and the test exercises it instead. Either way it asserts the final state of every row."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from flask import Blueprint, Response, request, stream_with_context
from sqlalchemy import text

from app.api.context import resolve_request_scope, services
from tests.integration.conftest import make_publisher, png_bytes
from tests.support.chromium import Browser
from tests.web.conftest import serving

pytestmark = pytest.mark.slow

TERMINAL_JOBS = text("""
    SELECT id, image_id, batch_id, status, completed_at FROM processing_jobs
     WHERE scope_id = :s AND status IN ('succeeded', 'failed', 'blocked', 'unknown_execution')
     ORDER BY completed_at, id""")


class StandInEvents:
    """``/api/v1/events`` as the contract describes it, derived from terminal jobs (ids = their order)."""

    def __init__(self) -> None:
        self.sse_requests: list[str] = []
        self.sent: list[str] = []
        self.lock = threading.Lock()

    def events(self, scope: str, after: int) -> list[dict]:
        with services().engine.connect() as conn:
            rows = conn.execute(TERMINAL_JOBS, {"s": scope}).all()
        return [{"id": i, "type": f"job.{r.status}", "scope_id": scope, "job_id": str(r.id),
                 "image_id": str(r.image_id), "batch_id": str(r.batch_id) if r.batch_id else None,
                 "payload": {"status": r.status}, "created_at": r.completed_at.isoformat()}
                for i, r in enumerate(rows, start=1) if i > after]

    def blueprint(self) -> Blueprint:
        bp = Blueprint("stand_in_events", __name__)

        @bp.get("/api/v1/events")
        def events():
            scope = resolve_request_scope()
            after = int(request.headers.get("Last-Event-ID") or request.args.get("after") or 0)
            if "text/event-stream" not in request.headers.get("Accept", ""):
                found = self.events(scope, after)[: int(request.args.get("limit", 100))]
                return {"events": found, "last_id": found[-1]["id"] if found else after}
            with self.lock:
                self.sse_requests.append(request.full_path)

            def stream():
                cursor, deadline = after, time.monotonic() + 20
                yield "retry: 500\n\n"
                while time.monotonic() < deadline:
                    for ev in self.events(scope, cursor):
                        cursor = ev["id"]
                        with self.lock:
                            self.sent.append(ev["job_id"])
                        yield f"id: {ev['id']}\nevent: {ev['type']}\ndata: {json.dumps(ev)}\n\n"
                    time.sleep(0.2)

            return Response(stream_with_context(stream()), mimetype="text/event-stream",
                            headers={"Cache-Control": "no-cache"})

        return bp


def test_live_progress_follows_the_event_stream(cluster, it_settings, engine, broker_url, tmp_path):
    from app.api import create_app
    from app.auth import TokenScopeResolver, create_scope, create_token

    cluster.worker("visual", "agent", "embedding")
    publisher, celery_app = make_publisher(broker_url)
    scope = f"events-{uuid.uuid4().hex[:6]}"
    create_scope(engine, scope)
    _, token = create_token(engine, scope, "browser")
    # token mode: the EventSource (which cannot send headers) rides on the signed-in page's session
    app = create_app(scope_resolver=TokenScopeResolver(engine), settings=it_settings.replace(auth="token"),
                     engine=engine, publisher=publisher)
    stand_in = StandInEvents()
    app.register_blueprint(stand_in.blueprint())
    real_endpoint = any(r.rule == "/api/v1/events" and not r.endpoint.startswith("stand_in_events")
                        for r in app.url_map.iter_rules())
    files = []
    for i in range(4):
        path = tmp_path / f"img-{i}.png"
        path.write_bytes(png_bytes(i + 1, size=64))
        files.append(str(path))
    try:
        with serving(app) as base, Browser(tmp_path / "profile", timeout=60) as browser:
            page = browser.new_page()
            page.goto(f"{base}/")
            page.wait_until("location.pathname === '/login' && !!document.querySelector('#token')")
            page.type_into("#token", token)
            page.click("button[type=submit]")
            page.wait_until("location.pathname === '/' && document.body.dataset.ready === '1'")
            page.wait_until("document.querySelector('#live-mode').dataset.mode === 'events'", timeout=30)
            page.set_input_files("#files", files)
            # a file that is not an image, dropped (the picker's accept= filter does not apply)
            page.drop_files("#drop", [("notes.txt", "text/plain", b"not an image")])
            states = page.wait_until(
                "(() => { const s = [...document.querySelectorAll('#uploads li')].map(li => [li.dataset.name,"
                " li.dataset.state]); return s.length === 5 && s.every(x => x[1] === 'done' || x[1] === 'failed')"
                " ? Object.fromEntries(s) : null; })()", timeout=120)
            assert states == {**{f"img-{i}.png": "done" for i in range(4)}, "notes.txt": "failed"}
            bad = page.evaluate("document.querySelector('#uploads li[data-name=\"notes.txt\"] .state').textContent")
            assert bad.startswith("unsupported_media_type")
            assert page.evaluate("document.querySelector('#live-mode').dataset.mode") == "events"
            assert page.csp_violations() == []
        if not real_endpoint:
            assert stand_in.sse_requests and all("after=" in p for p in stand_in.sse_requests)
    finally:
        celery_app.close()
