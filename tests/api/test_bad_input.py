"""Bad input: each gets its 4xx and stable code, and leaves no rows and no files behind."""

from __future__ import annotations

import io
import struct
import uuid
import zlib

import pytest
from sqlalchemy import text

from app.api import create_app
from app.auth import LocalScopeResolver
from tests.api.conftest import png_bytes, upload
from tests.unit.stages.helpers import gif_of_frames, jpeg_with_repeated_scans, png_chunk, png_with_chunks, zlib_bomb
from tests.unit.stages.test_images import truncated_animated_gif


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bomb(width: int = 30000, height: int = 30000) -> bytes:
    """A PNG header claiming width x height pixels with a tiny (invalid) body: cheap to craft."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def snapshot(engine, store_root):
    with engine.connect() as conn:
        images = conn.execute(text("SELECT count(*) FROM images")).scalar_one()
        jobs = conn.execute(text("SELECT count(*) FROM processing_jobs")).scalar_one()
        tasks = conn.execute(text("SELECT count(*) FROM tasks")).scalar_one()
    files = sorted(str(p) for p in store_root.rglob("*")) if store_root.exists() else []
    return images, jobs, tasks, files


@pytest.fixture()
def unchanged(engine, settings):
    before = snapshot(engine, settings.storage_path)
    yield
    assert snapshot(engine, settings.storage_path) == before


UPLOAD_CASES = [
    ("zero bytes", b"", {}, 422, "invalid_image"),
    ("truncated png", png_bytes()[:40], {}, 422, "invalid_image"),
    # its first frame decodes, but the pipeline's decoder counts every frame (and fails)
    ("truncated animated gif", truncated_animated_gif(), {}, 422, "invalid_image"),
    ("text named .png", b"hello, I am not an image\n" * 4, {}, 415, "unsupported_media_type"),
    ("png bomb", png_bomb(), {}, 422, "invalid_image"),
    # small, but each of its 1000 extra scans is a pass over the whole image (tests/unit/stages/test_jpeg_scans.py)
    ("jpeg of endless scans", jpeg_with_repeated_scans(1000, size=1024), {}, 422, "invalid_image"),
    # small, but Pillow walked each frame / chunk / inflated each bomb (tests/unit/stages/test_decode_limits.py)
    ("gif of endless frames", gif_of_frames(20_001), {}, 422, "invalid_image"),
    ("png of endless chunks", png_with_chunks(png_chunk(b"prVt", b"") * 30_000), {}, 422, "invalid_image"),
    ("png of metadata bombs", png_with_chunks(png_chunk(b"iCCP", b"icc\0\0" + zlib_bomb()) * 40), {}, 422,
     "invalid_image"),
    ("bad policy", png_bytes(), {"reverse_image_policy": "always"}, 422, "invalid_reverse_image_policy"),
    ("unknown form field", png_bytes(), {"scope_id": "beta"}, 422, "validation_error"),
    ("bad process flag", png_bytes(), {"process": "perhaps"}, 422, "validation_error"),
]


@pytest.mark.parametrize("name,data,form,status,code", UPLOAD_CASES, ids=[c[0] for c in UPLOAD_CASES])
def test_bad_uploads(client, unchanged, name, data, form, status, code):
    r = upload(client, data, **form)
    assert r.status_code == status, r.get_json()
    assert r.get_json()["error"] == code


def test_missing_file(client, unchanged):
    r = client.post("/api/v1/images", data={"display_name": "x"}, content_type="multipart/form-data")
    assert (r.status_code, r.get_json()["error"]) == (400, "missing_file")
    r = client.post("/api/v1/images", data={"file": "not a file part"}, content_type="multipart/form-data")
    assert (r.status_code, r.get_json()["error"]) == (400, "missing_file")
    r = client.post("/api/v1/images", json={"file": "x"})
    assert (r.status_code, r.get_json()["error"]) == (415, "unsupported_media_type")


def test_extra_file_part_rejected(client, unchanged):
    r = client.post(
        "/api/v1/images",
        data={"file": (io.BytesIO(png_bytes()), "a.png"), "other": (io.BytesIO(b"x"), "b.txt")},
        content_type="multipart/form-data",
    )
    assert (r.status_code, r.get_json()["error"]) == (422, "validation_error")


def test_body_over_limit(settings, engine, orch, publisher, store, unchanged):
    app = create_app(
        scope_resolver=LocalScopeResolver(), settings=settings.replace(max_upload_bytes=2000),
        orchestrator=orch, engine=engine, publisher=publisher, store=store,
    )
    c = app.test_client()
    big = png_bytes(size=(400, 400), fmt="BMP")[:3000]  # content irrelevant: size is checked first
    r = upload(c, b"\x89PNG\r\n\x1a\n" + big)
    assert (r.status_code, r.get_json()["error"]) == (413, "payload_too_large")
    huge = b"\x89PNG\r\n\x1a\n" + b"\0" * (200 * 1024)  # over MAX_CONTENT_LENGTH (limit + framing)
    r = upload(c, huge)
    assert (r.status_code, r.get_json()["error"]) == (413, "payload_too_large")


def test_json_body_errors(client, unchanged):
    some = uuid.uuid4()
    cases = [
        ("post", f"/api/v1/images/{some}/process", {"force_stages": ["ocr"]}, 422, "invalid_stage"),
        ("post", f"/api/v1/images/{some}/process", {"reverse_image_policy": "x"}, 422, "invalid_reverse_image_policy"),
        ("post", f"/api/v1/images/{some}/process", {"scope_id": "beta"}, 422, "validation_error"),
        ("post", f"/api/v1/images/{some}/process", {"force_stages": "visual"}, 422, "invalid_stage"),
        ("patch", f"/api/v1/images/{some}", {"context": {"title": "t", "evil": 1}}, 422, "validation_error"),
        ("patch", f"/api/v1/images/{some}", {"display_name": 5}, 422, "validation_error"),
        ("patch", f"/api/v1/images/{some}", {}, 422, "validation_error"),
        ("post", "/api/v1/batches", {"all": True, "scope_id": "beta"}, 422, "validation_error"),
        ("post", "/api/v1/batches", {"all": "yes please"}, 422, "validation_error"),
        ("post", "/api/v1/batches", {"image_ids": ["not-a-uuid"]}, 422, "validation_error"),
        ("post", "/api/v1/batches", {}, 422, "validation_error"),
        ("post", "/api/v1/batches", {"all": True, "reverse_image_policy": "x"}, 422, "invalid_reverse_image_policy"),
        ("post", "/api/v1/search/visual", {"image_id": "nope"}, 422, "validation_error"),
        ("post", "/api/v1/search/visual", {"image_id": str(some), "x": 1}, 422, "validation_error"),
    ]
    for method, path, body, status, code in cases:
        r = getattr(client, method)(path, json=body)
        assert (r.status_code, r.get_json()["error"]) == (status, code), (path, body, r.get_json())
    r = client.post(f"/api/v1/images/{some}/process", data="{not json", content_type="application/json")
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_json"


def test_query_errors(client, unchanged):
    for path, code in [
        ("/api/v1/images?cursor=abc", "invalid_cursor"),
        ("/api/v1/images?cursor=eyJ4IjoxfQ.AAAA", "invalid_cursor"),
        ("/api/v1/images?limit=0", "validation_error"),
        ("/api/v1/images?limit=101", "validation_error"),
        ("/api/v1/images?limit=ten", "validation_error"),
        ("/api/v1/jobs?status=exploded", "validation_error"),
        ("/api/v1/jobs?image_id=123", "validation_error"),
        ("/api/v1/jobs?cursor=%%%", "invalid_cursor"),
        ("/api/v1/search/text", "validation_error"),
        ("/api/v1/search/text?q=", "validation_error"),
        ("/api/v1/search/text?q=x&limit=1000", "validation_error"),
    ]:
        r = client.get(path)
        assert (r.status_code, r.get_json()["error"]) == (422, code), (path, r.get_json())


def test_invalid_uuid_paths_are_404(client, unchanged):
    for path in ["/api/v1/images/123", "/api/v1/jobs/xyz", "/api/v1/tasks/1", "/api/v1/batches/../x"]:
        r = client.get(path)
        assert (r.status_code, r.get_json()["error"]) == (404, "not_found"), path


UNSTORABLE = {"nul": "a\x00b", "lone high surrogate": "a\ud800b", "lone low surrogate": "\udfff", "only nul": "\x00"}


@pytest.mark.parametrize("kind", list(UNSTORABLE))
def test_unstorable_text_is_422_invalid_text_everywhere(client, engine, settings, kind):
    """NUL and lone surrogates (PostgreSQL cannot store them) in every text input: 422 invalid_text,
    nothing written; the same strings minus the bad character are accepted."""
    bad = UNSTORABLE[kind]
    r = upload(client, png_bytes((1, 2, 3)), process=False)
    image_id = r.get_json()["image"]["id"]
    before = snapshot(engine, settings.storage_path)
    with engine.connect() as conn:
        image_before = conn.execute(text("SELECT revision, display_name, context FROM images")).one()

    if "surrogate" not in kind:  # a multipart field is UTF-8 on the wire: a surrogate cannot travel
        r = upload(client, png_bytes((4, 5, 6)), display_name=bad)
        assert (r.status_code, r.get_json()["error"]) == (422, "invalid_text"), r.get_json()
    patches = [
        {"display_name": bad},
        {"context": {"title": bad}},
        {"context": {"description": f"fine, then {bad}"}},
        {"context": {"ocr_text": bad}},
        {"context": {"tags": ["ok", bad]}},
        {"context": {bad: "value"}},
        {"display_name": "fine", "context": {"title": "fine", "tags": [bad]}},
    ]
    for body in patches:
        r = client.patch(f"/api/v1/images/{image_id}", json=body)
        assert (r.status_code, r.get_json()["error"]) == (422, "invalid_text"), (body, r.get_json())
        assert r.is_json
    if "surrogate" not in kind:  # a URL is UTF-8 too
        r = client.get("/api/v1/search/text", query_string={"q": bad})
        assert (r.status_code, r.get_json()["error"]) == (422, "invalid_text"), r.get_json()
    r = client.post("/api/v1/batches", json={"image_ids": [bad]})
    assert r.status_code == 422
    r = client.post("/api/v1/batches", json={"all": True, "reverse_image_policy": bad})
    assert r.status_code == 422

    assert snapshot(engine, settings.storage_path) == before
    with engine.connect() as conn:
        assert conn.execute(text("SELECT revision, display_name, context FROM images")).one() == image_before
    clean = bad.replace("\x00", "").replace("\ud800", "").replace("\udfff", "") or "x"
    r = client.patch(f"/api/v1/images/{image_id}", json={"display_name": clean, "context": {"tags": [clean]}})
    assert r.status_code == 200, r.get_json()


def test_search_query_edges(client):
    """Blank and over-long queries are 422; 1 character, emoji-only and mixed scripts are 200."""
    from app.api.schemas import MAX_QUERY_CHARS

    upload(client, png_bytes((9, 9, 9)))
    for q in ["", " ", "\t\n ", "　", "x" * (MAX_QUERY_CHARS + 1)]:
        r = client.get("/api/v1/search/text", query_string={"q": q})
        assert (r.status_code, r.get_json()["error"]) == (422, "validation_error"), (q, r.get_json())
    for q in ["a", "猫", "😂", "😂🔥💯", "🤣" * 100, "deploy 周五 on Friday 😱", "x" * MAX_QUERY_CHARS, "% _ \\ ' \"",
              "a & b | !c", "'; DROP TABLE images; --", "ʕ•ᴥ•ʔ", "١٢٣ مرحبا", "\u200b", "e\u0301"]:
        for mode in ("hybrid", "semantic", "lexical"):
            r = client.get("/api/v1/search/text", query_string={"q": q, "mode": mode})
            assert r.status_code == 200, (q, mode, r.get_json())
            assert isinstance(r.get_json()["items"], list)
    # raw bytes that are not UTF-8 in the query string: replaced, not a 5xx
    r = client.get("/api/v1/search/text?q=%ED%A0%80%FF")
    assert r.status_code in (200, 422), r.get_json()


def test_replacing_content_with_another_images_bytes_is_409(client, engine, settings, store):
    """Found by the fuzzer: the scope's unique (scope, sha256) made this a 500. Now 409
    duplicate_image, the image, its job and the files unchanged."""
    a = upload(client, png_bytes((1, 1, 1))).get_json()
    b_bytes = png_bytes((2, 2, 2))
    upload(client, b_bytes)
    before = snapshot(engine, settings.storage_path)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT sha256, revision FROM images WHERE id = :i"), {"i": a["image"]["id"]}).one()
    r = client.put(f"/api/v1/images/{a['image']['id']}/content",
                   data={"file": (io.BytesIO(b_bytes), "b.png")}, content_type="multipart/form-data")
    assert (r.status_code, r.get_json()["error"]) == (409, "duplicate_image"), r.get_json()
    assert snapshot(engine, settings.storage_path) == before
    with engine.connect() as conn:
        assert conn.execute(text("SELECT sha256, revision FROM images WHERE id = :i"),
                            {"i": a["image"]["id"]}).one() == row
    assert client.get(f"/api/v1/jobs/{a['job']['id']}").get_json()["status"] == a["job"]["status"]


def test_an_oversized_list_is_refused_before_its_items_are_read(client, unchanged):
    """A list one past its field's limit is 422 on its length alone: its items (all invalid here)
    are never read — reading a million of them held an API thread for seconds."""
    from app.api.schemas import MAX_IMAGE_IDS, TAGS_SENT_MAX

    some = uuid.uuid4()
    cases = [
        ("patch", f"/api/v1/images/{some}", {"context": {"tags": [0] * (TAGS_SENT_MAX + 1)}}, "context.tags",
         "validation_error"),
        ("post", f"/api/v1/images/{some}/process", {"force_stages": [0] * 4}, "force_stages", "invalid_stage"),
        ("post", "/api/v1/batches", {"image_ids": [0] * (MAX_IMAGE_IDS + 1)}, "image_ids", "validation_error"),
        ("post", "/api/v1/webhooks", {"url": "https://example.com/h", "event_types": [0] * 33}, "event_types",
         "invalid_event_type"),
    ]
    for method, path, body, field, code in cases:
        r = getattr(client, method)(path, json=body)
        out = r.get_json()
        assert (r.status_code, out["error"]) == (422, code), (path, out)
        assert out["details"]["fields"] == {field: [out["details"]["fields"][field][0]]}, out
        assert out["details"]["fields"][field][0].startswith("Longer than maximum length"), out
    # at the limit, the items are read (and the invalid ones named)
    r = client.patch(f"/api/v1/images/{some}", json={"context": {"tags": [0] * TAGS_SENT_MAX}})
    assert r.status_code == 422 and "Longer than" not in str(r.get_json()), r.get_json()


def test_deeply_nested_json_is_400(client, unchanged):
    """json.loads raises RecursionError (not ValueError) on deep nesting: a 400, not a 500."""
    deep = ["[" * 100_000, '{"a":' * 100_000, "[" * 100_000 + "]" * 100_000]
    some = uuid.uuid4()
    for method, path in [("post", "/api/v1/batches"), ("post", "/api/v1/search/visual"),
                         ("patch", f"/api/v1/images/{some}"), ("post", f"/api/v1/images/{some}/process")]:
        for body in deep:
            r = getattr(client, method)(path, data=body, content_type="application/json")
            assert (r.status_code, r.get_json()["error"]) == (400, "invalid_json"), (path, r.get_json())


def test_a_json_integer_longer_than_int_converts_is_400(client, unchanged):
    """json.loads raises a plain ValueError (not the JSONDecodeError webargs catches) for an
    integer of more than 4300 digits: a 400, not a 500."""
    big, some = "9" * 5000, uuid.uuid4()
    for method, path, body in [
        ("patch", f"/api/v1/images/{some}", f'{{"display_name": {big}}}'),
        ("post", f"/api/v1/images/{some}/process", f'{{"force_stages": [{big}]}}'),
        ("post", "/api/v1/batches", f'{{"all": true, "x": {big}}}'),
        ("post", "/api/v1/webhooks", f'{{"url": "https://example.com/h", "n": -{big}}}'),
    ]:
        r = getattr(client, method)(path, data=body, content_type="application/json")
        assert (r.status_code, r.get_json()["error"]) == (400, "invalid_json"), (path, r.get_json())
