"""Thumbnails: bound to the image version (sha256), made once, cached on disk, ETag/304, scope-checked,
and hostile stored files answered with a clear 4xx (never a 5xx); bytes that are not the stored
content are a 503 ``storage_corrupt`` (tests/api/test_tampered_files.py)."""

from __future__ import annotations

import hashlib
import io
import struct
import threading
import zlib

from PIL import Image

from app import thumbnails
from app.metrics import THUMBNAILS_GENERATED
from tests.api.conftest import png_bytes, upload


def _thumb(client, image_id: str, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return client.get(f"/api/v1/images/{image_id}/thumbnail" + (f"?{query}" if query else ""))


def _generated() -> float:
    return THUMBNAILS_GENERATED._value.get()


def _cache_path(settings, image: dict, size: int):
    return list((settings.storage_path / thumbnails.THUMBS_DIR).glob(f"*/{image['sha256']}-{size}-*.webp"))


def test_a_bounded_webp_with_etag_304_and_cache_headers(client):
    image = upload(client, png_bytes(size=(800, 400))).get_json()["image"]
    resp = _thumb(client, image["id"])
    assert resp.status_code == 200 and resp.mimetype == "image/webp"
    with Image.open(io.BytesIO(resp.data)) as im:
        assert im.format == "WEBP" and im.size == (256, 128)
    assert resp.headers["ETag"] == f'"{image["sha256"]}-256-{thumbnails.RENDER_VERSION}"'
    assert resp.headers["Cache-Control"] == "private, no-cache"
    again = client.get(f"/api/v1/images/{image['id']}/thumbnail", headers={"If-None-Match": resp.headers["ETag"]})
    assert again.status_code == 304 and again.data == b""
    pinned = _thumb(client, image["id"], size=512, v=image["sha256"])
    assert pinned.status_code == 200 and "immutable" in pinned.headers["Cache-Control"]
    with Image.open(io.BytesIO(pinned.data)) as im:
        assert im.size == (512, 256)
    small = upload(client, png_bytes(color=(1, 2, 3), size=(40, 30))).get_json()["image"]
    with Image.open(io.BytesIO(_thumb(client, small["id"]).data)) as im:
        assert im.size == (40, 30)  # never enlarged
    for bad in ({"size": 100}, {"size": "huge"}, {"v": "abc"}):
        refused = _thumb(client, image["id"], **bad)
        assert refused.status_code == 422 and refused.get_json()["error"] == "validation_error", bad


def test_made_once_and_then_served_from_the_disk_cache(client, settings):
    image = upload(client, png_bytes(size=(300, 300))).get_json()["image"]
    before = _generated()
    first = _thumb(client, image["id"], size=128)
    [path] = _cache_path(settings, image, 128)
    stat = path.stat()
    second = _thumb(client, image["id"], size=128)
    assert first.data == second.data == path.read_bytes()
    assert path.stat().st_mtime_ns == stat.st_mtime_ns and path.stat().st_ino == stat.st_ino
    assert _generated() - before == 1

    # many concurrent first requests for a new size: decoded and written once
    results: list[int] = []
    app = client.application

    def fetch() -> None:
        results.append(app.test_client().get(f"/api/v1/images/{image['id']}/thumbnail?size=512").status_code)

    before = _generated()
    threads = [threading.Thread(target=fetch) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results == [200] * 8
    assert _generated() - before == 1
    assert len(_cache_path(settings, image, 512)) == 1


def test_a_content_replace_yields_the_new_versions_thumbnail(client):
    image = upload(client, png_bytes(color=(220, 20, 20), size=(200, 200))).get_json()["image"]
    old = _thumb(client, image["id"])
    replaced = client.put(f"/api/v1/images/{image['id']}/content", content_type="multipart/form-data",
                          data={"file": (io.BytesIO(png_bytes(color=(20, 20, 220), size=(200, 100))), "b.png")})
    assert replaced.status_code == 200
    new_sha = replaced.get_json()["image"]["sha256"]
    assert new_sha != image["sha256"]
    new = client.get(f"/api/v1/images/{image['id']}/thumbnail", headers={"If-None-Match": old.headers["ETag"]})
    assert new.status_code == 200  # the old ETag no longer matches
    assert new.headers["ETag"] == f'"{new_sha}-256-{thumbnails.RENDER_VERSION}"' != old.headers["ETag"]
    assert new.data != old.data
    with Image.open(io.BytesIO(new.data)) as im:
        assert im.size == (256, 128) or im.size == (200, 100)
        assert im.convert("RGB").getpixel((5, 5))[2] > 150  # blue: the new content
    gone = _thumb(client, image["id"], v=image["sha256"])
    assert gone.status_code == 404 and gone.get_json()["error"] == "not_found"
    assert _thumb(client, image["id"], v=new_sha).status_code == 200


def test_another_scopes_image_is_404_and_caches_are_per_scope(token_app, tokens, settings):
    client = token_app.test_client()
    alpha, beta = ({"Authorization": f"Bearer {tokens[s]}"} for s in ("alpha", "beta"))
    data = png_bytes(color=(9, 99, 199), size=(64, 64))
    image = upload(client, data, headers=alpha).get_json()["image"]
    assert client.get(f"/api/v1/images/{image['id']}/thumbnail", headers=alpha).status_code == 200
    for headers in (beta, {}):
        other = client.get(f"/api/v1/images/{image['id']}/thumbnail", headers=headers)
        assert other.status_code == (404 if headers else 401)
    # the same bytes in beta: its own image, its own cached file under its own namespace
    mine = upload(client, data, headers=beta).get_json()["image"]
    assert mine["id"] != image["id"]
    assert client.get(f"/api/v1/images/{mine['id']}/thumbnail", headers=beta).status_code == 200
    namespaces = {p.parent.name for p in _cache_path(settings, image, 256)}
    assert len(namespaces) == 2


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares ``width``×``height`` pixels in a few dozen bytes (a decompression bomb)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_hostile_stored_files_are_a_clear_4xx(client, settings, store, engine):
    from sqlalchemy import text

    cases = {
        "corrupt": png_bytes()[:40] + b"\x00garbage" * 20,
        "bomb": _png_header_only(60_000, 60_000),
        "not_an_image": b"%PDF-1.4 not an image at all",
        "empty": b"",
    }
    for i, (name, bad) in enumerate(cases.items()):
        image = upload(client, png_bytes(color=(i * 40, 5, 5), size=(50, 50))).get_json()["image"]
        with engine.connect() as conn:
            key = conn.execute(text("SELECT storage_key FROM images WHERE id = :i"), {"i": image["id"]}).scalar_one()
        # hostile bytes stored under their own sha256 (bytes that hash otherwise are refused before
        # decoding: 503 storage_corrupt, tests/api/test_tampered_files.py)
        sha = hashlib.sha256(bad).hexdigest()
        new_key = f"{key.split('/')[0]}/{sha}.png"
        store.path(new_key).write_bytes(bad)
        with engine.begin() as conn:
            conn.execute(text("UPDATE images SET sha256 = :h, storage_key = :k WHERE id = :i"),
                         {"h": sha, "k": new_key, "i": image["id"]})
        image["sha256"] = sha
        resp = _thumb(client, image["id"])
        assert resp.status_code == 422, (name, resp.status_code, resp.get_data(as_text=True))
        assert resp.get_json()["error"] == "invalid_image", name
        assert not _cache_path(settings, image, 256), name  # nothing cached for a failure
    image = upload(client, png_bytes(color=(1, 200, 1))).get_json()["image"]
    with engine.connect() as conn:
        key = conn.execute(text("SELECT storage_key FROM images WHERE id = :i"), {"i": image["id"]}).scalar_one()
    store.path(key).unlink()
    missing = _thumb(client, image["id"])
    assert missing.status_code == 404 and missing.get_json()["error"] == "not_found"


def test_render_thumbnail_refuses_a_bomb_before_decoding_pixels():
    import pytest

    with pytest.raises(thumbnails.ThumbnailError):
        thumbnails.render_thumbnail(_png_header_only(60_000, 60_000), 256, max_pixels=40_000_000)
    with pytest.raises(ValueError):
        thumbnails.render_thumbnail(png_bytes(), 300)


def test_gc_prunes_thumbnails_of_versions_no_image_has(client, settings, orch, engine):
    from app.cli.maintenance import collect_garbage

    image = upload(client, png_bytes(color=(5, 150, 5), size=(90, 90))).get_json()["image"]
    keep = upload(client, png_bytes(color=(150, 5, 5), size=(90, 90))).get_json()["image"]
    for img in (image, keep):
        assert _thumb(client, img["id"]).status_code == 200
    old_files = _cache_path(settings, image, 256)
    client.put(f"/api/v1/images/{image['id']}/content", content_type="multipart/form-data",
               data={"file": (io.BytesIO(png_bytes(color=(5, 5, 150), size=(90, 90))), "c.png")})
    new = client.get(f"/api/v1/images/{image['id']}").get_json()
    assert _thumb(client, image["id"]).status_code == 200
    # the originals' gc never touches the thumbnail cache
    collect_garbage(orch, settings.storage_path, min_age_s=0, dry_run=False)
    assert old_files[0].exists()
    cache = thumbnails.ThumbnailCache(settings.storage_path)
    assert cache.prune(thumbnails.live_versions(engine), min_age_s=3600) == []  # too young
    assert cache.prune(thumbnails.live_versions(engine)) == old_files
    assert not old_files[0].exists()
    assert _cache_path(settings, new, 256) and _cache_path(settings, keep, 256)
    kept_files = _cache_path(settings, keep, 256)
    assert client.delete(f"/api/v1/images/{keep['id']}").status_code == 204
    assert cache.prune(thumbnails.live_versions(engine)) == kept_files
    assert not _cache_path(settings, keep, 256)
