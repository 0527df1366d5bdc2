"""/api/docs renders in a real Chromium with every byte served by memeflow (no CDN, no internet)."""

from __future__ import annotations

from urllib.parse import urlsplit

from tests.support.chromium import Browser
from tests.web.conftest import serving


def test_swagger_ui_renders_offline_from_memeflow_assets(make_app, tmp_path):
    with serving(make_app("none")) as base, Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        page.goto(f"{base}/api/docs")
        title = page.wait_until("document.querySelector('.swagger-ui .info .title')?.textContent")
        assert title.startswith("memeflow")
        # the operations of the spec are listed (the UI fetched and parsed /api/openapi.json)
        page.wait_until("document.querySelectorAll('.opblock').length > 10")
        urls = page.requested_urls()
        foreign = [u for u in urls if urlsplit(u).scheme in ("http", "https") and not u.startswith(base + "/")]
        assert foreign == [], f"requests left memeflow: {foreign}"
        scripts = page.evaluate("[...document.scripts].map(s => s.src)")
        assert scripts and all(s.startswith(f"{base}/api/docs/") for s in scripts), scripts
        assert f"{base}/api/openapi.json" in urls
        assert page.csp_violations() == []
