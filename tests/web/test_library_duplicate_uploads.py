"""Two uploads of the same bytes in one drop share one job: both rows of the upload list follow it
to the end, in headless Chromium with in-process workers.

Identical bytes return the existing image and its active job (SPEC §4.1, §4.2), so the second
row is handed the very job id the first one is already following. The page kept one row per job id:
the later row took the job over and the earlier one stayed "queued" for good, whatever the job did."""

from __future__ import annotations

from sqlalchemy import text

from app.api import create_app
from app.auth import LocalScopeResolver
from app.orchestrator import Orchestrator, RecordingPublisher
from app.storage import FileStore
from tests.api.conftest import png_bytes
from tests.conftest import poll_until
from tests.support.chromium import Browser
from tests.support.pipeline import Workers
from tests.web.conftest import serving

ROWS = ("(() => [...document.querySelectorAll('#uploads li')]"
        ".map(li => [li.dataset.name, li.dataset.state, li.dataset.jobId || null]))()")


def _open_streams(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM event_stream_slots")).scalar_one()


def test_every_row_of_a_shared_job_finishes(settings, engine, tmp_path):
    app_settings = settings.replace(auth="none", event_heartbeat_s=0.2)
    orch, publisher = Orchestrator(engine, app_settings), RecordingPublisher()
    app = create_app(scope_resolver=LocalScopeResolver(), settings=app_settings, orchestrator=orch, engine=engine,
                     publisher=publisher, store=FileStore(settings.storage_path), cursor_secret_key="test-secret")
    same = png_bytes((12, 150, 90), size=(40, 30))
    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        try:
            page.goto(f"{base}/")
            page.wait_until("document.body.dataset.ready === '1' && "
                            "['events', 'poll'].includes(document.querySelector('#live-mode').dataset.mode)")
            page.drop_files("#drop", [("meme.png", "image/png", same), ("meme (copy).png", "image/png", same)])
            rows = page.wait_until(f"(() => {{ const r = {ROWS}; return r.length === 2 && r.every(x => x[2]) "
                                   "? r : null; })()")
            assert rows[0][2] == rows[1][2], rows  # one image, one job
            with Workers(orch, publisher, n=2):
                def finished():
                    publisher.publish(orch.sweep().hints)  # re-hints what a wake-up group held back
                    states = page.evaluate(ROWS)
                    return states if all(s[1] in ("done", "failed") for s in states) else None

                states = poll_until(finished, timeout=60, interval=0.2, what="both upload rows to finish")
            assert {name: state for name, state, _ in states} == {"meme.png": "done", "meme (copy).png": "done"}
            assert page.csp_violations() == []
        finally:
            page.goto("about:blank")  # the page's event stream ends with it
            poll_until(lambda: _open_streams(engine) == 0, timeout=30, what="the server to end the page's stream")
