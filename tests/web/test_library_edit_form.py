"""The library page's context form, in headless Chromium: saved without a change it writes
nothing; a changed field sends the rest of the context back as PATCH stores it; the context and the
name are each sent only when changed (a rename never stores an empty context, nor a context edit a
mangled name)."""

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


def _open(page, base: str, image_id: str) -> None:
    page.goto(f"{base}/library/images/{image_id}")
    page.wait_until("document.body.dataset.ready === '1'")
    assert not page.evaluate("location.search.includes('updated=')")


def _save(page) -> str:
    """Save the form; wait until the page has its answer: the form's state, or "reloaded"."""
    page.click("#save-context")
    page.wait_until(SAVED + " || (document.querySelector('#context-form') || {dataset: {}}).dataset.state"
                    " === 'unchanged'")
    return page.evaluate("location.search.includes('updated=') ? 'reloaded'"
                         " : document.querySelector('#context-form').dataset.state")


def _uploaded(api, n: int) -> list[str]:
    ids = []
    for i in range(n):
        created = upload(api, png_bytes(color=(30 + 90 * i, 60, 90)), name=f"form-{i}.png", process=False)
        assert created.status_code == 201, created.get_json()
        ids.append(created.get_json()["image"]["id"])
    return ids


CONTEXT = {"title": "Deploy freeze, Friday edition", "description": "\nstarts with a line break\nand goes on",
           "ocr_text": "line one\nline two", "tags": TAGS}


def test_saving_the_form_unchanged_writes_nothing(make_app, engine, tmp_path):
    app = make_app("none")
    exact, legacy = _uploaded(app.test_client(), 2)
    _set_context(engine, exact, CONTEXT)
    _set_context(engine, legacy, {**CONTEXT, "title": "Deploy freeze\nFriday edition"})
    before = [_stored(engine, exact), _stored(engine, legacy)]

    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        for image_id in (exact, legacy):
            _open(page, base, image_id)
            assert page.evaluate("document.querySelector('#f-tags').value.split('\\n')") == TAGS
            assert _save(page) == "unchanged"
        assert page.csp_violations() == []
        page.goto("about:blank")

    assert [_stored(engine, exact), _stored(engine, legacy)] == before  # nothing written, no new revision


def test_changing_one_field_sends_the_others_as_stored(make_app, engine, tmp_path):
    """The rest of the context goes back as PATCH stores it: a tag with a comma stays one tag, a
    description that starts with a line break keeps it; a title written with a line break before
    titles were one line is saved as the one line PATCH makes of it, not glued together."""
    app = make_app("none")
    exact, legacy = _uploaded(app.test_client(), 2)
    _set_context(engine, exact, CONTEXT)
    _set_context(engine, legacy, {**CONTEXT, "title": "Deploy freeze\nFriday edition"})

    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        for image_id in (exact, legacy):
            _open(page, base, image_id)
            page.evaluate("document.querySelector('#f-ocr_text').value = 'line one\\nline 2'")
            assert _save(page) in ("saved", "reloaded")
        page.goto("about:blank")

    assert _stored(engine, exact)[0] == {**CONTEXT, "ocr_text": "line one\nline 2"}
    assert _stored(engine, legacy)[0] == {**CONTEXT, "ocr_text": "line one\nline 2",
                                          "title": "Deploy freeze Friday edition"}


def test_renaming_an_image_before_its_ocr_ran_leaves_it_without_a_context(make_app, engine, tmp_path):
    """The form sent its (empty) context fields with every save: renaming an image whose agent had
    not run yet stored an empty human-edited context, and its OCR then never ran."""
    app = make_app("none")
    [image_id] = _uploaded(app.test_client(), 1)

    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        page = browser.new_page()
        _open(page, base, image_id)
        page.evaluate("document.querySelector('#f-display_name').value = 'renamed early'")
        assert _save(page) in ("saved", "reloaded")
        page.goto("about:blank")

    with engine.connect() as conn:
        row = conn.execute(text("SELECT display_name, context, context_status FROM images WHERE id = :id"),
                           {"id": image_id}).one()
    assert (row.display_name, row.context, row.context_status) == ("renamed early", None, "pending")


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
