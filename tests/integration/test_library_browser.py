"""The library page in a real headless Chromium, against a real server and real Celery workers with
the real default providers (live_stack): sign in with a token → upload sample memes through the file
input and by drag-and-drop → every row's live progress reaches done → a hybrid text search in
English and in Chinese shows the hit with its highlight → look-alikes of the near-duplicate find its
original → the image page shows the context and the stage timeline, and an edit of the context is
saved and re-runs the text stage. No CSP violation, no request off this machine.

Live progress follows the event stream when the server has one and polls the jobs when it answers
404, so the test asserts only the final per-row state (polled with a deadline), in either case.
Set ``MEMEFLOW_DOCS_SCREENSHOTS=1`` to refresh docs/img/library-*.png from this run."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from app.auth import TokenScopeResolver, create_scope, create_token
from app.samples import generate_samples
from tests.support.chromium import Browser, CdpError
from tests.web.conftest import serving

pytestmark = pytest.mark.slow

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
VIA_INPUT = ("friday-deploy.png", "jiayou.png", "build-passes.png")


def _shot(page, tmp_path: Path, name: str, height: int = 900) -> None:
    path = tmp_path / f"library-{name}.png"
    page.screenshot(path, width=1280, height=height)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    if os.environ.get("MEMEFLOW_DOCS_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_IMG / path.name)


def _search(page, query: str) -> list[dict]:
    page.evaluate("document.querySelector('#q').value = ''")
    page.type_into("#q", query)
    page.click("#search button[type=submit]")
    page.wait_until(f"document.querySelector('#results-title').textContent.includes({json.dumps(query)}) && "
                    "document.querySelector('#results').dataset.count !== undefined", timeout=60)
    return _result_cards(page)


def _result_cards(page) -> list[dict]:
    return page.evaluate("""[...document.querySelectorAll('#results-grid .card')].map(c => ({
        id: c.dataset.imageId, name: c.querySelector('.name').textContent,
        marks: [...c.querySelectorAll('.hl mark')].map(m => m.textContent),
        highlight: (c.querySelector('.hl') || {}).textContent || ''}))""")


def test_library_upload_live_progress_search_lookalikes_and_image_page(live_stack, tmp_path):
    from app.api import create_app

    scope = f"library-{uuid.uuid4().hex[:8]}"
    create_scope(live_stack.engine, scope)
    _, token = create_token(live_stack.engine, scope, "browser")
    samples = {p.name: p for p in generate_samples(tmp_path / "samples", limit=6)}
    assert set(VIA_INPUT) | {"build-passes-small.jpg"} <= set(samples)
    dropped = [p for name, p in sorted(samples.items()) if name not in VIA_INPUT]
    settings = live_stack.settings.replace(auth="token")
    app = create_app(scope_resolver=TokenScopeResolver(live_stack.engine), settings=settings)

    with serving(app) as base, Browser(tmp_path / "profile", timeout=60) as browser:
        page = browser.new_page()
        page.goto(f"{base}/")
        page.wait_until("location.pathname === '/login' && !!document.querySelector('#token')")
        page.type_into("#token", token)
        page.click("button[type=submit]")
        page.wait_until("location.pathname === '/' && document.body.dataset.ready === '1'")
        page.wait_until("['events', 'poll'].includes(document.querySelector('#live-mode').dataset.mode)")

        # many files: three through the file input, the rest by drag-and-drop
        page.set_input_files("#files", [str(samples[n]) for n in VIA_INPUT])
        page.drop_files("#drop", [(p.name, "image/jpeg" if p.suffix == ".jpg" else "image/png", p.read_bytes())
                                  for p in dropped])
        total = len(samples)
        page.wait_until(f"document.querySelectorAll('#uploads li').length === {total}")
        try:  # for the screenshot only: a moment with rows in several states, if the run shows one
            page.wait_until("document.querySelector('#uploads li[data-state=processing]') && "
                            "document.querySelector('#uploads li:not([data-state=done])')", timeout=20)
        except CdpError:
            pass
        _shot(page, tmp_path, "progress")
        states = page.wait_until(
            "(() => { const s = [...document.querySelectorAll('#uploads li')].map(li => li.dataset.state);"
            " return s.every(x => x === 'done' || x === 'failed') ? s : null; })()", timeout=300)
        failed = page.evaluate("[...document.querySelectorAll('#uploads li[data-state=failed]')]"
                               ".map(li => li.textContent)")
        assert states == ["done"] * total, failed
        rows = {r["name"]: r for r in page.evaluate(
            "[...document.querySelectorAll('#uploads li')].map(li => ({name: li.dataset.name,"
            " id: li.dataset.imageId, job: li.dataset.jobId}))")}
        assert set(rows) == set(samples) and all(r["id"] and r["job"] for r in rows.values())
        assert page.evaluate("document.querySelectorAll('#library-grid .card').length") == total
        # every thumbnail in the grid loaded (served by the thumbnail endpoint, pinned to the version)
        page.wait_until("[...document.querySelectorAll('#library-grid .card img')].every(i => i.complete && "
                        "i.naturalWidth > 0 && i.naturalWidth <= 256)", timeout=60)
        _shot(page, tmp_path, "uploaded")

        # hybrid text search with highlights, English then Chinese
        hits = _search(page, "deploy on friday")
        assert hits and hits[0]["name"] == "friday-deploy.png", hits
        assert {m.lower() for m in hits[0]["marks"]} & {"deploy", "friday"}, hits[0]
        _shot(page, tmp_path, "search-en")
        hits = _search(page, "加油")
        assert hits and hits[0]["name"] == "jiayou.png", hits
        assert "加油" in "".join(hits[0]["marks"]), hits[0]
        _shot(page, tmp_path, "search-zh")

        # look-alikes of the recompressed, scaled copy: its original comes first
        small = rows["build-passes-small.jpg"]["id"]
        page.click(f"#library-grid .card[data-image-id='{small}'] button.lookalike")
        page.wait_until("document.querySelector('#results').dataset.like === " + json.dumps(small), timeout=60)
        alike = _result_cards(page)
        assert alike and alike[0]["name"] == "build-passes.png" and small not in {c["id"] for c in alike}, alike
        _shot(page, tmp_path, "lookalikes")

        # the image page: context and stage timeline; then edit the context
        image_id = rows["friday-deploy.png"]["id"]
        page.click(f"#library-grid .card[data-image-id='{image_id}'] a.name")
        page.wait_until(f"location.pathname === '/library/images/{image_id}' && document.body.dataset.ready === '1'")
        assert "FRIDAY" in page.evaluate("document.querySelector('#f-ocr_text').value").upper()
        stages = page.evaluate("[...document.querySelectorAll('#stages tr[data-stage]')]"
                               ".map(r => [r.dataset.stage, r.dataset.status])")
        assert stages == [["visual", "succeeded"], ["agent", "succeeded"], ["text_embedding", "succeeded"]]
        assert page.evaluate("document.querySelectorAll('#tasks tr[data-stage]').length") >= 3
        page.evaluate("document.querySelector('#f-title').value = ''")
        page.type_into("#f-title", "Deploy freeze, Friday edition")
        page.evaluate("document.querySelector('#f-tags').value = ''")
        page.type_into("#f-tags", "deploy\nfriday\n周五")  # one tag a line
        page.click("#save-context")
        page.wait_until("location.search.includes('updated=') && document.body.dataset.ready === '1' && "
                        "document.querySelector('#job-status').textContent === 'succeeded'", timeout=120)
        assert page.evaluate("document.querySelector('#f-title').value") == "Deploy freeze, Friday edition"
        assert page.evaluate("document.querySelector('#f-tags').value") == "deploy\nfriday\n周五"
        assert page.evaluate("document.querySelector('#context-status').textContent") == "edited"
        stages = page.evaluate("[...document.querySelectorAll('#stages tr[data-stage]')]"
                               ".map(r => [r.dataset.stage, r.dataset.status])")
        assert stages == [["visual", "reused"], ["agent", "reused"], ["text_embedding", "succeeded"]]
        _shot(page, tmp_path, "image", height=1100)

        # the edited words are searchable from the library page
        page.goto(f"{base}/?q=" + "freeze")
        page.wait_until("document.querySelector('#results').dataset.count > 0", timeout=60)
        assert _result_cards(page)[0]["id"] == image_id

        assert page.csp_violations() == []
        assert all(u.startswith((base, "data:", "about:")) for u in page.requested_urls()), page.requested_urls()
