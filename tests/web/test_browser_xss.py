"""No stored or reflected XSS on any page, proven in headless Chromium with the CSP switched off.

Every field a page renders that a user, an uploaded image's pixels (the agent's OCR, title, tags,
description), a paid provider (model, request id), an error or a URL can control is seeded with
markup that would run script if it ever became markup: display names (upload, drop on the page,
PATCH), the context fields (PATCH, and raw SQL for what only an agent writes), search highlights,
job error messages, provenance, webhook URLs and error codes, the scope id shown in the header, and
query strings the pages reflect or once did (``/?q=``, ``/?like=``, ``/login?next=``, ``/ops?msg=&err=``).

The pages' CSP forbids inline script, which would hide an injection; so each tab runs with
``Page.setBypassCSP`` and only escaping stands between the payload and the page. A payload that
became markup either runs (``window.__pwned`` is set, a dialog opens) or leaves an element whose id
starts with ``pwn-``; the test asserts neither happened and that the text is shown literally."""

from __future__ import annotations

import json
import uuid

from sqlalchemy import text

from tests.api.conftest import png_bytes, upload
from tests.conftest import poll_until
from tests.support.chromium import Browser, Page
from tests.web.conftest import serving


def hostile(tag: str) -> str:
    """Markup that runs script (and leaves ``#pwn-<tag>``) wherever it is parsed as HTML or as an
    attribute value breaking out of its quotes."""
    return (f'"\'><img src=x id=pwn-{tag} onerror="window.__pwned=\'{tag}\'">'
            f'<script>window.__pwned="{tag}"</script><svg id=pwn-{tag}-svg onload=alert(1)>')


def hostile_short(tag: str) -> str:
    """The same within 100 characters (a tag's limit)."""
    return f'"\'><img src=x id=pwn-{tag} onerror=window.__pwned=1><b id=pwn-{tag}-b>'


# no "/" (a scope id may not hold one): still an attribute break-out and an event handler
HOSTILE_SCOPE = '"\'><img src=x id=pwn-scope onerror=window.__pwned=1>'
NOT_RUN = ("window.__pwned === undefined && document.querySelector('[id^=pwn-]') === null && "
           "document.querySelector('script:not([src])') === null")


def _unsafe_tab(browser: Browser) -> Page:
    """A tab whose pages' CSP is ignored, so that only the pages' escaping is under test."""
    page = browser.new_page()
    page.send("Page.setBypassCSP", {"enabled": True})
    # a dialog would block the page (and this test) until a deadline: record it instead
    page.send("Page.addScriptToEvaluateOnNewDocument",
              {"source": "for (const f of ['alert', 'confirm', 'prompt']) window[f] = () => { window.__pwned = f; };"})
    return page


def _dialogs(browser: Browser, page: Page) -> list[dict]:
    return browser.events_since(0, "Page.javascriptDialogOpening", page.session)


def _assert_inert(browser: Browser, page: Page, where: str) -> None:
    assert page.evaluate(NOT_RUN), (where, page.evaluate("window.__pwned"),
                                    page.evaluate("[...document.querySelectorAll('[id^=pwn-]')].map(e => e.id)"))
    assert _dialogs(browser, page) == [], where


def _body_text(page: Page) -> str:
    return page.evaluate("document.body.textContent")


def _seed_agent_fields(engine, image_id: str, job_id: str) -> None:
    """What only the agent, a provider or a failure writes: past the API, straight into the rows."""
    with engine.begin() as conn:
        conn.execute(text("""
            UPDATE images SET context = CAST(:ctx AS jsonb), context_status = 'ready',
                   context_provenance = CAST(:prov AS jsonb), search_tsv = to_tsvector('simple', 'zebra')
             WHERE id = :i"""),
                     {"i": image_id,
                      "ctx": json.dumps({"title": hostile("title"), "description": hostile("desc"),
                                         "ocr_text": "zebra " + hostile("ocr") + " zebra",
                                         "tags": [hostile("tag1"), hostile("tag2")]}),
                      "prov": json.dumps({"model": hostile("model"), "provider_request_id": hostile("reqid")})})
        conn.execute(text("""
            UPDATE processing_jobs SET status = 'failed', completed_at = now(),
                   error = CAST(:err AS jsonb) WHERE id = :j"""),
                     {"j": job_id, "err": json.dumps({"code": hostile("jobcode"), "message": hostile("jobmsg")})})
        conn.execute(text("UPDATE job_stages SET error = CAST(:err AS jsonb) WHERE job_id = :j"),
                     {"j": job_id, "err": json.dumps({"code": hostile("stagecode"), "message": "x"})})
        sub = uuid.uuid4()
        conn.execute(text("""
            INSERT INTO webhook_subscriptions (id, scope_id, url, event_types, secret, last_error, attempts)
            VALUES (:id, 'local', :url, ARRAY['job.failed'], 's', CAST(:err AS jsonb), 0)"""),
                     {"id": sub, "url": "https://x.example/" + hostile("hookurl"),
                      "err": json.dumps({"code": hostile("hookerr")})})
        conn.execute(text("""
            INSERT INTO webhook_failures (scope_id, subscription_id, event_id, attempts, error)
            VALUES ('local', :id, 1, 5, CAST(:err AS jsonb))"""),
                     {"id": sub, "err": json.dumps({"code": hostile("failcode"), "message": hostile("failmsg")})})


def _open_streams(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM event_stream_slots")).scalar_one()


def test_no_stored_or_reflected_xss_on_any_page_in_chromium(make_app, engine, tmp_path):
    app = make_app("none", event_heartbeat_s=0.2)
    api = app.test_client()
    created = upload(api, png_bytes(color=(10, 200, 30)), name="a.png", display_name=hostile("name"))
    assert created.status_code == 201, created.get_json()
    image_id, job_id = created.get_json()["image"]["id"], created.get_json()["job"]["id"]
    _seed_agent_fields(engine, image_id, job_id)
    # a second image whose context came through the API (PATCH), searchable by "zebra"
    second = upload(api, png_bytes(color=(200, 10, 30)), name="b.png", process=False).get_json()["image"]["id"]
    edited = api.patch(f"/api/v1/images/{second}", json={
        "display_name": hostile("patchname"),
        "context": {"title": hostile("ptitle"), "ocr_text": "zebra " + hostile("pocr"), "tags": [hostile_short("ptag")]}})
    assert edited.status_code == 200, edited.get_json()

    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        page = _unsafe_tab(browser)
        try:
            # /ops: the failed job's name and message, webhook URL and codes; and reflected flashes
            page.goto(f"{base}/ops?" + "&".join(f"{k}={v}" for k, v in
                                                (("msg", _q(hostile("msg"))), ("err", _q(hostile("err"))))))
            _assert_inert(browser, page, "/ops")
            shown = _body_text(page)
            for tag in ("name", "jobmsg"):
                assert hostile(tag) in shown, tag
            assert "pwn-msg" not in shown and "pwn-err" not in shown  # notices never come from the URL
            assert hostile("hookerr") in shown and "failcode" in shown

            # /ops per-image page: context and provenance as JSON text, the stage error code
            page.goto(f"{base}/ops/images/{image_id}")
            _assert_inert(browser, page, "/ops/images")
            shown = _body_text(page)
            assert hostile("name") in shown and "pwn-model" in shown and "pwn-stagecode" in shown

            # the library's image page: every context field, as text and as form values
            page.goto(f"{base}/library/images/{image_id}")
            page.wait_until("document.body.dataset.ready === '1'")
            _assert_inert(browser, page, "/library/images")
            values = page.evaluate("""Object.fromEntries(['display_name', 'title', 'description', 'ocr_text', 'tags']
                .map(n => [n, document.querySelector('#context-form').elements[n].value]))""")
            assert values == {"display_name": hostile("name"), "title": hostile("title"),
                              "description": hostile("desc"), "ocr_text": "zebra " + hostile("ocr") + " zebra",
                              "tags": hostile("tag1") + "\n" + hostile("tag2")}
            assert page.evaluate("document.title").startswith(hostile("name"))
            assert page.evaluate("document.querySelector('img.big').alt") == hostile("name")

            # the library grid (server-rendered cards), then a search whose highlights hold the markup
            page.goto(f"{base}/?q=zebra")
            page.wait_until("document.body.dataset.ready === '1' && document.querySelector('#results').dataset.count"
                            " === '2'")
            _assert_inert(browser, page, "/?q=zebra")
            highlights = page.evaluate("[...document.querySelectorAll('#results-grid .hl')].map(p => p.textContent)")
            # snippets of the OCR text (cut with "…"), the markup in them shown as text
            assert sorted(h[:60] for h in highlights) == sorted(
                ("ocr_text: zebra " + hostile(tag))[:60] for tag in ("ocr", "pocr")), highlights
            marks = page.evaluate("[...document.querySelectorAll('#results-grid .hl mark')].map(m => m.textContent)")
            assert len(marks) >= 2 and set(marks) == {"zebra"}, marks
            names = page.evaluate("[...document.querySelectorAll('.card .name')].map(a => a.textContent)")
            assert names.count(hostile("name")) == 2 and names.count(hostile("patchname")) == 2  # grid + hits

            # a query and an image id reflected by the page script (titles and API error messages)
            for query in (f"?q={_q(hostile('q'))}", f"?q={_q(hostile('longq') + 'x' * 600)}",
                          f"?like={_q(hostile('like'))}"):
                page.goto(f"{base}/{query}")
                page.wait_until("document.body.dataset.ready === '1' && "
                                "!/^(searching|looking)/.test(document.querySelector('#search-status').textContent)")
                _assert_inert(browser, page, query)
            # the short query's results title shows it literally
            page.goto(f"{base}/?q={_q(hostile('q'))}")
            page.wait_until("document.querySelector('#results-title').textContent.length > 0")
            assert hostile("q") in page.evaluate("document.querySelector('#results-title').textContent")

            # a file dropped on the page under a hostile name: its upload row and its new grid card
            page.goto(f"{base}/")
            page.wait_until("document.body.dataset.ready === '1'")
            page.drop_files("#drop", [(hostile("file") + ".png", "image/png", png_bytes(color=(1, 2, 3)))])
            page.wait_until("document.querySelector('#uploads li.up .open') !== null")
            _assert_inert(browser, page, "drop")
            assert page.evaluate("document.querySelector('#uploads .fname').textContent") == hostile("file") + ".png"
            assert hostile("file") + ".png" in page.evaluate("document.querySelector('#library-grid .card .name')"
                                                             ".textContent")
            page.click("#library-grid .card button.lookalike")  # look-alikes of a hostile name
            page.wait_until("document.querySelector('#results-title').textContent.startsWith('Look-alikes of')")
            _assert_inert(browser, page, "look-alikes")
            assert page.csp_violations() == []  # nothing tried to run even against the (bypassed) CSP
        finally:
            page.goto("about:blank")  # the library page's event stream ends with it
            poll_until(lambda: _open_streams(engine) == 0, timeout=30,
                       what="the server to end the page's event stream")


def test_scope_id_and_sign_in_page_are_escaped_in_token_mode(make_app, engine, token_for, tmp_path):
    """Token mode: the scope id (chosen by an operator, shown in every page's header) and the sign-in
    page's ``next`` and error message."""
    _, token = token_for(HOSTILE_SCOPE)
    app = make_app("token", event_heartbeat_s=0.2)
    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        page = _unsafe_tab(browser)
        page.goto(f"{base}/login?next={_q(hostile('next'))}")
        _assert_inert(browser, page, "/login?next=")
        assert page.evaluate("document.querySelector('input[name=next]').value") == "/ops/"  # not a local path
        next_path = "/?x=" + hostile("next")  # a local path, kept: markup in an attribute value
        page.goto(f"{base}/login?next={_q(next_path)}")
        _assert_inert(browser, page, "/login?next=/?x=")
        assert page.evaluate("document.querySelector('input[name=next]').value") == next_path
        page.evaluate("document.querySelector('#token').value = " + json.dumps(hostile("token")))
        page.click("button[type=submit]")
        page.wait_until("document.querySelector('#login-error') !== null")
        _assert_inert(browser, page, "refused sign-in")
        page.goto(f"{base}/login?next=/ops")
        page.wait_until("!!document.querySelector('#token')")
        page.type_into("#token", token)
        page.click("button[type=submit]")
        page.wait_until("location.pathname === '/ops' && document.readyState === 'complete'")
        _assert_inert(browser, page, "/ops signed in")
        assert HOSTILE_SCOPE in _body_text(page)
        page.goto(f"{base}/library/images/{uuid.uuid4()}")  # a 404 for the scope
        page.goto(f"{base}/")
        page.wait_until("document.body.dataset.ready === '1'")
        _assert_inert(browser, page, "/ signed in")
        assert page.evaluate("document.querySelector('#scope').textContent") == HOSTILE_SCOPE
        page.goto("about:blank")
        poll_until(lambda: _open_streams(engine) == 0, timeout=30, what="the server to end the page's event stream")


def _q(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")
