"""Cross-site requests from a real page of another origin, in headless Chromium, change nothing.

The attacker's page is served by a second real HTTP server on the same host, another port: the
same *site* as memeflow, so the browser does send memeflow's ``SameSite=Strict`` cookies with its
requests (SameSite ignores ports) — the strongest position short of XSS. From there it tries every
state-changing request memeflow's pages make or accept: a no-CORS ``fetch`` upload (multipart needs
no preflight), a no-CORS JSON batch as ``text/plain``, a preflighted PATCH and DELETE, and top-level
form POSTs to an API write, the /ops retry, sign-out and sign-in (login CSRF into the attacker's
own token). Each is refused (the navigations show memeflow's JSON or HTML refusal), and the
database, read afterwards, holds exactly what it held before. A real HTTP client with a forged
``Origin`` gets the same JSON refusals from the same server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from flask import Flask
from sqlalchemy import text

from tests.api.conftest import png_bytes, upload
from tests.conftest import poll_until
from tests.support.chromium import Browser
from tests.web.conftest import serving

STATE = """SELECT (SELECT count(*) FROM images), (SELECT count(*) FROM processing_jobs),
                  (SELECT count(*) FROM batches), (SELECT count(*) FROM browser_sessions),
                  (SELECT string_agg(coalesce(display_name, '') || ':' || revision, ',' ORDER BY id) FROM images)"""


def _state(engine) -> tuple:
    with engine.connect() as conn:
        return tuple(conn.execute(text(STATE)).one())


def _open_streams(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM event_stream_slots")).scalar_one()


def _attacker(base: str, image_id: str, job_id: str, attacker_token: str) -> Flask:
    """The other origin's page: scripted requests on load, and forms the test submits one by one."""
    app = Flask("attacker")
    png = list(png_bytes(color=(66, 6, 6)))
    script = f"""
      const base = {json.dumps(base)}, id = {json.dumps(image_id)};
      const png = new Uint8Array({json.dumps(png)});
      const tries = [];
      const go = (name, url, opts) => tries.push(fetch(base + url, {{credentials: 'include', ...opts}})
        .then(r => [name, r.type, r.status], e => [name, 'error', String(e)]));
      const form = new FormData();
      form.append('file', new Blob([png], {{type: 'image/png'}}), 'evil.png');
      form.append('display_name', 'uploaded-by-evil');
      go('upload', '/api/v1/images', {{method: 'POST', mode: 'no-cors', body: form}});
      go('batch', '/api/v1/batches', {{method: 'POST', mode: 'no-cors', headers: {{'Content-Type': 'text/plain'}},
                                       body: JSON.stringify({{all: true}})}});
      go('patch', '/api/v1/images/' + id, {{method: 'PATCH', headers: {{'Content-Type': 'application/json'}},
                                             body: JSON.stringify({{display_name: 'renamed-by-evil'}})}});
      go('delete', '/api/v1/images/' + id, {{method: 'DELETE'}});
      Promise.all(tries).then(r => {{ window.__done = r; }});
    """
    forms = {
        "api-retry": (f"/api/v1/jobs/{job_id}/retry", {}),
        "ops-retry": (f"/ops/jobs/{job_id}/retry", {"csrf_token": "guessed"}),
        "logout": ("/logout", {"csrf_token": "guessed"}),
        "login": ("/login", {"csrf_token": "guessed", "token": attacker_token, "next": "/"}),
    }
    html = "".join(
        f'<form id="{name}" method="post" action="{base}{action}">'
        + "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in fields.items())
        + f'<button id="go-{name}" type="submit">{name}</button></form>'
        for name, (action, fields) in forms.items())

    @app.get("/")
    def page():
        return f"<!doctype html><body>{html}<script src='/evil.js'></script></body>"

    @app.get("/evil.js")
    def evil_js():
        return app.response_class(script, mimetype="text/javascript")

    return app


@pytest.mark.parametrize("auth", ["none", "token"])
def test_a_foreign_origin_page_changes_nothing(make_app, engine, token_for, tmp_path, auth):
    app = make_app(auth, event_heartbeat_s=0.2)
    api = app.test_client()
    headers = {}
    if auth == "token":
        _, token = token_for("victim")
        headers = {"Authorization": f"Bearer {token}"}
    _, attacker_token = token_for("evil")
    created = upload(api, png_bytes(), display_name="mine", headers=headers).get_json()
    image_id, job_id = created["image"]["id"], created["job"]["id"]
    assert api.post(f"/api/v1/jobs/{job_id}/cancel", headers=headers).status_code == 200  # retryable

    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        victim = browser.new_page()
        if auth == "token":  # the victim is signed in: the attacker's requests carry the cookie
            victim.goto(f"{base}/login?next=/")
            victim.type_into("#token", token)
            victim.click("button[type=submit]")
            victim.wait_until("location.pathname === '/' && document.body.dataset.ready === '1'")
            assert [c["name"] for c in victim.cookies() if c["name"] == "mf_session"] == ["mf_session"]
        else:
            victim.goto(f"{base}/ops/images/{image_id}")  # holds the double-submit CSRF cookie
        victim.goto("about:blank")
        poll_until(lambda: _open_streams(engine) == 0, timeout=30, what="the library page's event stream to end")
        before = _state(engine)

        with serving(_attacker(base, image_id, job_id, attacker_token)) as evil:
            assert evil.split(":")[1] == base.split(":")[1] and evil != base  # same site, other origin
            page = browser.new_page()
            page.goto(evil + "/")
            results = {name: (kind, status) for name, kind, status in page.wait_until("window.__done")}
            # no-CORS writes are sent (the server must refuse them) but the attacker reads nothing
            # (Cross-Origin-Resource-Policy even withholds the opaque answer); preflighted ones never leave
            assert all(results[n][0] in ("opaque", "error") for n in ("upload", "batch")), results
            assert results["patch"][0] == "error" and results["delete"][0] == "error", results
            assert _state(engine) == before

            refusals = {}
            for name in ("api-retry", "ops-retry", "logout", "login"):
                page.goto(evil + "/")
                page.click(f"#go-{name}")
                page.wait_until(f"location.origin === {json.dumps(base)} && document.readyState === 'complete'")
                refusals[name] = page.evaluate("document.body.textContent")
                assert _state(engine) == before, name

        api_refusal = json.loads(refusals["api-retry"])
        assert api_refusal["error"] == ("cross_site_request" if auth == "none" else "unauthorized")
        assert "cross-site request refused" in refusals["ops-retry"]
        assert "cross-site request refused" in refusals["logout"] and "cross-site request refused" in refusals["login"]
        if auth == "token":  # still signed in as itself (not signed out, not signed in as "evil")
            victim.goto(f"{base}/ops")
            assert victim.evaluate("document.querySelector('header').textContent").count("scope victim") == 1

        # a real HTTP client forging Origin gets the JSON refusal too, even with a stolen CSRF header
        cookie = "; ".join(f"{c['name']}={c['value']}" for c in victim.cookies())
        for method, path in (("POST", f"/api/v1/jobs/{job_id}/retry"), ("DELETE", f"/api/v1/images/{image_id}"),
                             ("PATCH", f"/api/v1/images/{image_id}")):
            req = urllib.request.Request(base + path, method=method, data=b'{"display_name": "x"}', headers={
                "Origin": "http://evil.example", "Cookie": cookie, "Content-Type": "application/json",
                "X-CSRF-Token": "stolen"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=10)
            body = json.loads(refused.value.read())
            assert refused.value.code == (403 if auth == "none" else 401), (method, path, body)
            assert body["error"] == ("cross_site_request" if auth == "none" else "unauthorized")
        assert _state(engine) == before
        victim.goto("about:blank")
