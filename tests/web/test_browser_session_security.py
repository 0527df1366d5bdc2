"""Browser sessions in headless Chromium: the cookie's flags, no session fixation, sign-out really
ends the session (its cookie replayed by a real HTTP client opens nothing), and ``next=`` never
leaves the site, whatever spelling a browser would resolve off-site."""

from __future__ import annotations

import json
import urllib.request
from urllib.parse import quote

from sqlalchemy import text

from tests.support.chromium import Browser, Page
from tests.web.conftest import serving

# Each would take a browser to evil.example if it were used as Location (or after URL parsing's
# backslash, tab and percent-decoding rules), or leaves the pages (the API, the docs).
OFF_SITE = [
    "//evil.example", "///evil.example", "////evil.example/ops", "https://evil.example", "https:evil.example",
    "http:/evil.example", "\\\\evil.example", "/\\evil.example", "\\/evil.example", "/\t/evil.example",
    "/%2F%2Fevil.example", "%2F%2Fevil.example", "/%5Cevil.example", "%5C%5Cevil.example",
    "/ops//evil.example", "/ops/\\evil.example", "/library\\..\\..\\evil.example", " //evil.example",
    "/?//evil.example", "javascript:alert(1)", "data:text/html,x", "/api/v1/images", "/api/docs",
    "/\u3000/evil.example", "/ops\r\nLocation: //evil.example", "http://evil.example@127.0.0.1/",
]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # noqa: ANN002, ANN003 - the handler's signature
        return None


def _status_with_cookie(url: str, cookie: str) -> tuple[int, str]:
    """(status, Location) of a GET that presents ``cookie``, redirects not followed."""
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers={"Cookie": cookie}), timeout=10) as resp:
            return resp.status, resp.headers.get("Location", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location", "")


def _sessions(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM browser_sessions")).scalar_one()


def _session_cookie(page: Page) -> str | None:
    return next((c["value"] for c in page.cookies() if c["name"] == "mf_session"), None)


def _sign_in(page: Page, base: str, token: str, next_path: str = "/ops") -> None:
    page.goto(f"{base}/login?next={quote(next_path, safe='')}")
    page.wait_until("!!document.querySelector('#token')")
    page.type_into("#token", token)
    page.click("button[type=submit]")
    page.wait_until("location.pathname !== '/login' && document.readyState === 'complete'")


def test_cookie_flags_no_fixation_and_sign_out_in_chromium(make_app, engine, token_for, tmp_path):
    _, alpha = token_for("alpha")
    _, beta = token_for("beta")
    app = make_app("token")
    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        host = base.split("//")[1].split(":")[0]
        # fixation: a session id planted before sign-in (by a sibling page, a proxy) is never adopted
        planted = "planted-by-the-attacker-0123456789"
        page.send("Network.setCookie", {"name": "mf_session", "value": planted, "domain": host, "path": "/"})
        _sign_in(page, base, alpha)
        first = _session_cookie(page)
        assert first and first != planted
        cookie = next(c for c in page.cookies() if c["name"] == "mf_session")
        assert (cookie["httpOnly"], cookie["sameSite"], cookie["secure"], cookie["path"]) == (True, "Strict", False, "/")
        assert page.evaluate("document.cookie").find("mf_session") == -1
        assert _status_with_cookie(f"{base}/ops", f"mf_session={planted}")[0] == 303
        assert _status_with_cookie(f"{base}/ops", f"mf_session={first}")[0] == 200

        # sign-out: the row is gone, so the old cookie replayed from elsewhere opens nothing
        page.goto(f"{base}/ops")
        page.click("#logout button")
        page.wait_until("location.pathname === '/login'")
        assert _session_cookie(page) is None and _sessions(engine) == 0
        for path in ("/ops", "/", "/library/images/00000000-0000-0000-0000-000000000000"):
            assert _status_with_cookie(base + path, f"mf_session={first}")[0] == 303, path

        # signing in again (here: as another scope) makes a new session; the old id stays dead
        _sign_in(page, base, beta)
        second = _session_cookie(page)
        assert second and second not in (first, planted)
        assert "scope beta" in page.evaluate("document.querySelector('header').textContent")
        assert _status_with_cookie(f"{base}/ops", f"mf_session={first}") == (303, "/login?next=/ops")
        assert _sessions(engine) == 1


def test_next_never_leaves_the_site_in_chromium(make_app, token_for, tmp_path):
    _, token = token_for("alpha")
    app = make_app("token")
    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        _sign_in(page, base, token, next_path="//evil.example")  # the form's own redirect
        assert page.evaluate("location.origin") == base and page.evaluate("location.pathname") == "/ops/"
        for target in OFF_SITE:  # signed in: GET /login?next= redirects at once
            page.goto(f"{base}/login?next={quote(target, safe='')}")
            page.wait_until("document.readyState === 'complete'")
            landed = page.evaluate("[location.origin, location.pathname]")
            assert landed == [base, "/ops/"], (target, landed)
        # local pages are kept, with their query
        for target in ("/", "/?q=cat", "/ops/images/00000000-0000-0000-0000-000000000000", "/library/images/x"):
            page.goto(f"{base}/login?next={quote(target, safe='')}")
            page.wait_until("document.readyState === 'complete'")
            assert page.evaluate("location.origin + location.pathname + location.search") == base + target, \
                (target, json.dumps(page.url()))
