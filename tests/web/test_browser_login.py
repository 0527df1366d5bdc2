"""Token mode in a real headless Chromium: sign in by pasting a token, act on /ops, sign out; a
revoked token ends the session; a foreign page's form POST is refused; the API ignores the cookie.

Set ``MEMEFLOW_DOCS_SCREENSHOTS=1`` to refresh docs/login-screenshot.png from this run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from flask import Flask
from sqlalchemy import text

from app.auth import revoke_token
from tests.api.conftest import png_bytes, upload
from tests.support.chromium import Browser
from tests.web.conftest import serving

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _attacker_app(target_url: str, csrf_token: str) -> Flask:
    """Another origin's page whose form posts to memeflow (even holding a leaked CSRF token)."""
    app = Flask("attacker")

    @app.get("/")
    def page():
        return (f'<form method="post" action="{target_url}"><input type="hidden" name="csrf_token" '
                f'value="{csrf_token}"><button id="go" type="submit">win a prize</button></form>')

    return app


def _revisions(engine, image_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM processing_jobs WHERE image_id = :i"), {"i": image_id}).scalar()


def _sessions(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM browser_sessions")).scalar()


def _sign_in(page, token: str, expected_path: str) -> None:
    page.wait_until("location.pathname === '/login' && !!document.querySelector('#token')")
    page.type_into("#token", token)
    page.click("button[type=submit]")
    page.wait_until(f"location.pathname === {json.dumps(expected_path)} && document.readyState === 'complete'")


def test_sign_in_act_sign_out_and_revocation_in_chromium(make_app, engine, token_for, tmp_path):
    name, token = token_for("alpha")
    app = make_app("token")
    bearer = {"Authorization": f"Bearer {token}"}
    api = app.test_client()
    created = upload(api, png_bytes(size=(120, 90)), headers=bearer).get_json()
    image_id, job_id = created["image"]["id"], created["job"]["id"]
    assert api.post(f"/api/v1/jobs/{job_id}/cancel", headers=bearer).status_code == 200
    image_path = f"/ops/images/{image_id}"

    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        # no cookie yet: the page sends the browser to the sign-in form
        page.goto(base + image_path)
        page.wait_until("location.pathname === '/login'")
        shot = tmp_path / "login.png"
        page.screenshot(shot, width=1100, height=520)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
        if os.environ.get("MEMEFLOW_DOCS_SCREENSHOTS") == "1":
            shutil.copyfile(shot, DOCS / "login-screenshot.png")

        _sign_in(page, token, image_path)
        assert "scope alpha" in page.evaluate("document.querySelector('header').innerText")
        cookie = next(c for c in page.cookies() if c["name"] == "mf_session")
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and cookie["secure"] is False
        assert "mf_session" not in page.evaluate("document.cookie")  # unreadable by page scripts
        assert _sessions(engine) == 1
        # the thumbnail comes through /ops with the cookie alone
        assert page.wait_until("document.querySelector('#thumbnail img').naturalWidth") == 120

        # a page of another origin on the same site (the cookie IS sent: SameSite ignores ports)
        # posts the retry form, even with the right CSRF token: refused by the origin check
        csrf = page.evaluate("document.querySelector('input[name=csrf_token]').value")
        with serving(_attacker_app(f"{base}/ops/jobs/{job_id}/retry", csrf)) as evil:
            attack = browser.new_page()
            attack.goto(evil + "/")
            attack.click("#go")
            attack.wait_until("location.pathname.endsWith('/retry') && document.readyState === 'complete'")
            assert "cross-site request refused" in attack.evaluate("document.body.innerText")
        assert _revisions(engine, image_id) == 1

        # the page's own Retry button works
        page.click("#jobs form button")
        page.wait_until("document.querySelector('#flash')?.innerText.includes('retry requested')")
        assert _revisions(engine, image_id) == 2

        # the API does not take the cookie as a bearer substitute
        page.goto(f"{base}/api/v1/images")
        assert json.loads(page.evaluate("document.body.innerText"))["error"] == "unauthorized"

        # sign out: the row and the cookie are gone, /ops asks for a token again
        page.goto(f"{base}/ops")
        page.click("#logout button")
        page.wait_until("location.pathname === '/login'")
        assert _sessions(engine) == 0
        assert not [c for c in page.cookies() if c["name"] == "mf_session"]
        page.goto(f"{base}/ops")
        page.wait_until("location.pathname === '/login'")

        # sign in again, then revoke the token: the next page load lands on the sign-in form
        _sign_in(page, token, "/ops")
        page.wait_until("!!document.querySelector('#jobs-by-status')")
        revoke_token(engine, name)
        page.goto(f"{base}/ops")
        page.wait_until("location.pathname === '/login'")
        assert page.csp_violations() == []
