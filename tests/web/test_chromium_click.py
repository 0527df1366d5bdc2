"""The page tests' click (tests/support/chromium.py) is a click the page receives: it waits for the
element to be what a click at its centre would hit, and it never clicks twice."""

from __future__ import annotations

import pytest
from flask import Flask, Response

from tests.support.chromium import Browser, CdpError
from tests.web.conftest import serving

# The button sits under a transparent overlay for its first 400 ms: a click measured and sent at
# once lands on the overlay, as a user's would.
COVERED = b"""<!doctype html><html><body>
<button id="b" style="position:absolute;left:20px;top:20px;width:120px;height:40px">go</button>
<div id="cover" style="position:absolute;left:0;top:0;width:400px;height:200px"></div>
<script>
window.clicks = 0;
document.getElementById('b').addEventListener('click', () => { window.clicks += 1; });
setTimeout(() => document.getElementById('cover').remove(), 400);
</script></body></html>"""


@pytest.fixture()
def covered_page_url():
    app = Flask(__name__)
    app.add_url_rule("/", "covered", lambda: Response(COVERED, mimetype="text/html"))
    with serving(app) as base:
        yield base + "/"


def test_click_waits_until_the_element_is_hit_and_lands_once(covered_page_url, tmp_path):
    with Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        page.goto(covered_page_url)
        assert page.evaluate("!!document.getElementById('cover')")  # still covered when the click starts
        page.click("#b")
        assert page.evaluate("window.clicks") == 1
        assert page.evaluate("!document.getElementById('cover')")


def test_click_on_an_element_that_never_appears_fails_at_its_deadline(covered_page_url, tmp_path):
    with Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        page.goto(covered_page_url)
        with pytest.raises(CdpError):
            page.click("#missing", timeout=1.0)
