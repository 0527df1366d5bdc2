"""The library page's context form, in headless Chromium: opened and saved without a change, it
sends the stored context back as PATCH stores it (a tag with a comma stays one tag; a description
that starts with a line break keeps it), so the save is a no-op; a title written with a line break
before titles were one line is saved as the one line PATCH makes of it, not glued together."""

from __future__ import annotations

import json

from sqlalchemy import text

from tests.api.conftest import png_bytes, upload
from tests.support.chromium import Browser
from tests.web.conftest import serving

TAGS = ["yes, and", "周五，周六", "Friday deploy", "cat"]
# Saved: the page follows the new job ("saved"), or — nothing to follow — has reloaded and the new
# document is ready. ("reloading" is not enough: reading the page, or going to another, while the
# reload is under way races it.)
SAVED = ("(location.search.includes('updated=') && document.body.dataset.ready === '1') || "
         "(document.querySelector('#context-form') || {dataset: {}}).dataset.state === 'saved'")


def _set_context(engine, image_id: str, context: dict) -> None:
    """Write a context as it may be stored (an agent's, or one written before this rule) — past PATCH."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE images SET context = CAST(:c AS jsonb), context_status = 'edited' WHERE id = :id"),
                     {"c": json.dumps(context), "id": image_id})


def _stored(engine, image_id: str) -> tuple[dict, int]:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT context, revision FROM images WHERE id = :id"), {"id": image_id}).one()
    return row.context, row.revision


def _save_unchanged(page, base: str, image_id: str) -> None:
    """Open the image page, save the form as it comes, and wait until the page has its answer."""
    page.goto(f"{base}/library/images/{image_id}")
    page.wait_until("document.body.dataset.ready === '1'")
    assert not page.evaluate("location.search.includes('updated=')")
    page.click("#save-context")
    # saved: either the page follows the new job (state "saved") or, with nothing to follow, reloads
    page.wait_until(SAVED)


def test_saving_the_form_unchanged_round_trips_the_context(make_app, engine, tmp_path):
    app = make_app("none")
    api = app.test_client()
    ids = []
    for i in range(2):
        created = upload(api, png_bytes(color=(30 + 90 * i, 60, 90)), name=f"form-{i}.png", process=False)
        assert created.status_code == 201, created.get_json()
        ids.append(created.get_json()["image"]["id"])
    exact, legacy = ids
    context = {"title": "Deploy freeze, Friday edition", "description": "\nstarts with a line break\nand goes on",
               "ocr_text": "line one\nline two", "tags": TAGS}
    _set_context(engine, exact, context)
    _set_context(engine, legacy, {**context, "title": "Deploy freeze\nFriday edition"})
    before = _stored(engine, exact)

    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        _save_unchanged(page, base, exact)
        assert page.evaluate("document.querySelector('#f-tags').value.split('\\n')") == TAGS
        _save_unchanged(page, base, legacy)
        assert page.csp_violations() == []
        page.goto("about:blank")

    # the exact context came back as stored: nothing written, no new revision
    assert _stored(engine, exact) == before
    # the old multi-line title is stored as one line (as PATCH stores every title); the rest as it was
    stored, _ = _stored(engine, legacy)
    assert stored == {**context, "title": "Deploy freeze Friday edition"}


def test_saving_the_context_leaves_an_untouched_display_name_as_stored(make_app, engine, tmp_path):
    """A name may hold what a one-line input cannot show (a line break, which the browser drops from
    the field's value, or spaces at its ends, which the form trims): saving the context without
    touching the name must not rename the image."""
    app = make_app("none")
    api = app.test_client()
    name = " meme\ncollection "
    created = upload(api, png_bytes(color=(10, 120, 200)), name="name.png", process=False, display_name=name)
    assert created.status_code == 201, created.get_json()
    image_id = created.get_json()["image"]["id"]
    _set_context(engine, image_id, {"title": "t", "description": "", "ocr_text": "", "tags": ["cat"]})

    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        page.goto(f"{base}/library/images/{image_id}")
        page.wait_until("document.body.dataset.ready === '1'")
        page.evaluate("document.querySelector('#f-title').value = 'a new title'")
        page.click("#save-context")
        page.wait_until(SAVED)
        with engine.connect() as conn:
            row = conn.execute(text("SELECT display_name, context FROM images WHERE id = :id"), {"id": image_id}).one()
        assert row.context["title"] == "a new title"
        assert row.display_name == name
        # a name the user edits is sent (trimmed)
        page.goto(f"{base}/library/images/{image_id}")
        page.wait_until("document.body.dataset.ready === '1'")
        page.evaluate("document.querySelector('#f-display_name').value = ' renamed '")
        page.click("#save-context")
        page.wait_until(SAVED)
        page.goto("about:blank")

    with engine.connect() as conn:
        assert conn.execute(text("SELECT display_name FROM images WHERE id = :id"), {"id": image_id}).scalar_one() \
            == "renamed"
