"""The library page marks exactly the matched words of a search hit's highlight, in headless Chromium.

The API's ``highlight.marks`` count characters (code points); JavaScript strings count UTF-16
units, in which an emoji or any other character beyond the BMP is two. Images whose edited context
holds the query word after such characters are searched from the real page (``/?q=``, then the
search form) served by the real app; every ``<mark>`` must hold the word and nothing else.

The page follows the event stream while it is open; the test closes it (about:blank) and waits
until the server has let go of the stream before the database goes, so no request of this test
outlives it."""

from __future__ import annotations

import json

from sqlalchemy import text

from tests.api.conftest import png_bytes, upload
from tests.conftest import poll_until
from tests.support.chromium import Browser
from tests.web.conftest import serving

# OCR text → how many times the query word occurs in it (each occurrence its own mark)
TEXTS = {
    "cat": 1,
    "😂😂 the cat sat": 1,
    "𝐁𝐎𝐋𝐃 🐈 cat 🎉 cat": 2,
    "猫 cat 😀": 1,
    "🐱🐱🐱 CAT?": 1,
}


def _shown(page, query: str) -> dict[str, dict]:
    """The result cards of the search for ``query``, by image id: highlight text and marked texts."""
    page.wait_until(f"document.querySelector('#results-title').textContent.includes({json.dumps(query)}) && "
                    "document.querySelector('#results').dataset.count !== undefined")
    cards = page.evaluate("""[...document.querySelectorAll('#results-grid .card')].map(c => ({
        id: c.dataset.imageId, highlight: (c.querySelector('.hl') || {}).textContent || null,
        marks: [...c.querySelectorAll('.hl mark')].map(m => m.textContent)}))""")
    return {c["id"]: c for c in cards}


def _open_streams(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM event_stream_slots")).scalar_one()


def test_marks_land_on_the_matched_word_after_emoji_in_chromium(make_app, engine, tmp_path):
    # a short heartbeat: a stream whose page has gone finds out (its write fails) within a moment
    app = make_app("none", event_heartbeat_s=0.2)
    api = app.test_client()
    ids: dict[str, str] = {}
    for i, ocr in enumerate(TEXTS):
        created = upload(api, png_bytes(color=(10 + 20 * i, 40, 90)), name=f"hl-{i}.png",
                         display_name=f"hl-{i}.png", process=False)
        assert created.status_code == 201, created.get_json()
        image_id = created.get_json()["image"]["id"]
        edited = api.patch(f"/api/v1/images/{image_id}", json={"context": {"ocr_text": ocr}})
        assert edited.status_code == 200, edited.get_json()
        ids[image_id] = ocr
    # the edit wrote the lexical terms: the API's own highlights count code points
    hits = api.get("/api/v1/search/text", query_string={"q": "cat", "mode": "lexical"}).get_json()["items"]
    assert {h["image"]["id"] for h in hits} == set(ids)
    astral = {h["image"]["id"]: h["highlight"] for h in hits if ids[h["image"]["id"]] == "😂😂 the cat sat"}
    assert list(astral.values()) == [{"field": "ocr_text", "text": "😂😂 the cat sat", "marks": [[7, 10]]}]

    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        try:
            page.goto(f"{base}/?q=cat")  # the page searches its ?q= on load
            page.wait_until("document.body.dataset.ready === '1' && "
                            "document.querySelector('#live-mode').dataset.mode === 'events'")
            by_url = _shown(page, "cat")
            # and the search form, typed into as a user would
            page.evaluate("document.querySelector('#q').value = ''")
            page.type_into("#q", "CAT")
            page.click("#search button[type=submit]")
            by_form = _shown(page, "CAT")
            assert page.csp_violations() == []
        finally:
            page.goto("about:blank")  # the page's event stream ends with it
            poll_until(lambda: _open_streams(engine) == 0, timeout=30,
                       what="the server to end the page's event stream")
    for shown in (by_url, by_form):
        assert set(shown) == set(ids), shown
        for image_id, card in shown.items():
            ocr = ids[image_id]
            assert card["highlight"] == "ocr_text: " + ocr, card
            assert [m.lower() for m in card["marks"]] == ["cat"] * TEXTS[ocr], (ocr, card)
