"""PATCH /api/v1/images/{id} writes a context's title and tags as the agents write them
(app/stages/agent/context_text.py): the title one line, the tags trimmed, single-spaced, without
empties or duplicates by case or width — and the limits count what is stored."""

from __future__ import annotations

from sqlalchemy import text

from app.stages.agent import limits
from tests.api.conftest import png_bytes, upload


def _image(client) -> str:
    created = upload(client, png_bytes(), process=False)
    assert created.status_code == 201, created.get_json()
    return created.get_json()["image"]["id"]


def _stored(engine, image_id: str) -> dict:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT context, metadata_hash, revision FROM images WHERE id = :id"),
                                 {"id": image_id}).mappings().one())


def _jobs(engine, image_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM processing_jobs WHERE image_id = :id"),
                            {"id": image_id}).scalar_one()


def test_patch_stores_tags_and_title_normalised(client, engine):
    image_id = _image(client)
    r = client.patch(f"/api/v1/images/{image_id}", json={"context": {
        "title": "  Deploy\nfreeze,\t Friday  ",
        "tags": [" Cat ", "cat", "ＣＡＴ", "", "   ", "deploy\n  freeze", "Deploy Freeze", "yes, and",
                 "周五", "周五 ", "ｃａｔ　meme", "cat meme", "\u200b", "\u0301", "\u200bcat"],
    }})
    assert r.status_code == 200, r.get_json()
    context = r.get_json()["image"]["context"]
    assert context["title"] == "Deploy freeze, Friday"
    assert context["tags"] == ["Cat", "deploy freeze", "yes, and", "周五", "ｃａｔ meme"]
    assert _stored(engine, image_id)["context"] == context


def test_a_patch_differing_only_by_whitespace_and_duplicates_is_a_no_op(client, engine):
    image_id = _image(client)
    clean = {"title": "cat on a keyboard", "tags": ["cat", "keyboard cat"]}
    r = client.patch(f"/api/v1/images/{image_id}", json={"context": clean})
    assert r.status_code == 200, r.get_json()
    before, jobs = _stored(engine, image_id), _jobs(engine, image_id)
    assert before["context"]["tags"] == clean["tags"] and jobs == 1

    messy = {"title": " cat  on a\nkeyboard ", "tags": ["cat ", "CAT", " keyboard\tcat", "", "Keyboard Cat"]}
    r = client.patch(f"/api/v1/images/{image_id}", json={"context": messy})
    assert r.status_code == 200, r.get_json()
    after = _stored(engine, image_id)
    # the same context, the same hash: nothing written, no new job (as for an identical PATCH)
    assert after == before and _jobs(engine, image_id) == jobs
    assert r.get_json()["image"]["metadata_hash"] == before["metadata_hash"]


def test_the_limits_count_the_normalised_tags_and_title(client, engine):
    image_id = _image(client)
    padded = " " * 50 + "x" * limits.TAG_MAX + "\n" * 50
    many = [f"Tag  {i % (limits.TAGS_MAX - 1)}" for i in range(3 * limits.TAGS_MAX)]  # 99 distinct, 3 times
    title = "  " + " \n ".join(["word"] * (limits.TITLE_MAX // 5)) + "   "  # 99 words: 499 characters
    r = client.patch(f"/api/v1/images/{image_id}", json={"context": {"title": title, "tags": [padded, *many]}})
    assert r.status_code == 200, r.get_json()
    context = _stored(engine, image_id)["context"]
    assert context["tags"] == ["x" * limits.TAG_MAX, *(f"Tag {i}" for i in range(limits.TAGS_MAX - 1))]
    assert context["title"] == " ".join(["word"] * (limits.TITLE_MAX // 5))

    revision = _stored(engine, image_id)["revision"]
    for bad in ({"tags": ["x" * (limits.TAG_MAX + 1)]},
                {"tags": [f"t{i}" for i in range(limits.TAGS_MAX + 1)]},
                {"title": "y" * (limits.TITLE_MAX + 1)},
                {"tags": ["ok", 7]}):
        r = client.patch(f"/api/v1/images/{image_id}", json={"context": bad})
        assert (r.status_code, r.get_json()["error"]) == (422, "validation_error"), (bad, r.get_json())
    r = client.patch(f"/api/v1/images/{image_id}", json={"context": {"tags": ["ok", "x" * (limits.TAG_MAX + 1)]}})
    assert list(r.get_json()["details"]["fields"]) == ["context.tags.1"]  # the position as sent
    assert _stored(engine, image_id)["revision"] == revision
