"""The bytes the API serves or derives are the bytes it stored: a stored original whose bytes no
longer hash to the image's sha256 (overwritten, truncated, a symlink to other bytes) is never served
under an ETag naming that sha256, and no thumbnail is made — let alone cached for good — from it.
Such a file is a 503 ``storage_corrupt``; a file that is not a regular file (a directory, a FIFO)
is a 503 ``storage_unavailable`` without blocking; neither is a 500."""

from __future__ import annotations

import io
import os
import threading
import time

from app import thumbnails
from tests.api.conftest import png_bytes, upload


def _stored(settings, image: dict):
    [path] = list(settings.storage_path.glob(f"*/{image['sha256']}.png"))
    return path


def _thumbs(settings, image: dict) -> list:
    return list((settings.storage_path / thumbnails.THUMBS_DIR).glob(f"*/{image['sha256']}-*"))


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_tampered_original_is_not_served_under_its_sha256(client, settings):
    image = upload(client, png_bytes(size=(64, 64))).get_json()["image"]
    path = _stored(settings, image)
    original = path.read_bytes()
    _flip_a_byte(path)  # same size: only the content check sees it
    r = client.get(f"/api/v1/images/{image['id']}/content")
    assert r.status_code == 503, (r.status_code, r.data[:80])
    assert r.get_json()["error"] == "storage_corrupt"
    path.write_bytes(original[: len(original) // 2])  # truncated
    r = client.get(f"/api/v1/images/{image['id']}/content")
    assert r.status_code == 503 and r.get_json()["error"] == "storage_corrupt"
    path.write_bytes(original)  # restored from a backup: served again
    r = client.get(f"/api/v1/images/{image['id']}/content")
    assert r.status_code == 200 and r.data == original and r.headers["ETag"] == f'"{image["sha256"]}"'


def test_a_symlink_to_other_bytes_is_not_served(client, settings):
    image = upload(client, png_bytes(size=(64, 64))).get_json()["image"]
    other = settings.storage_path.parent / "elsewhere.png"
    other.write_bytes(png_bytes(color=(1, 2, 3), size=(64, 64)))
    path = _stored(settings, image)
    path.unlink()
    path.symlink_to(other)
    r = client.get(f"/api/v1/images/{image['id']}/content")
    assert r.status_code == 503, (r.status_code, r.data[:80])
    assert r.get_json()["error"] == "storage_corrupt"


def test_no_thumbnail_is_made_or_cached_from_tampered_bytes(client, settings):
    image = upload(client, png_bytes(size=(300, 200))).get_json()["image"]
    path = _stored(settings, image)
    original = path.read_bytes()
    path.write_bytes(png_bytes(color=(0, 0, 255), size=(300, 200)))  # another valid image
    for params in ("", "?size=512", f"?size=128&v={image['sha256']}"):
        r = client.get(f"/api/v1/images/{image['id']}/thumbnail{params}")
        assert r.status_code == 503, (params, r.status_code, r.data[:80])
        assert r.get_json()["error"] == "storage_corrupt"
    assert _thumbs(settings, image) == []
    path.write_bytes(original)
    r = client.get(f"/api/v1/images/{image['id']}/thumbnail")
    assert r.status_code == 200
    assert r.data == thumbnails.render_thumbnail(original, thumbnails.DEFAULT_SIZE)
    assert len(_thumbs(settings, image)) == 1


def test_a_directory_in_place_of_the_file_is_a_503_not_a_500(client, settings):
    image = upload(client, png_bytes(size=(64, 64))).get_json()["image"]
    path = _stored(settings, image)
    path.unlink()
    path.mkdir()
    for route in ("content", "thumbnail"):
        r = client.get(f"/api/v1/images/{image['id']}/{route}")
        assert r.status_code == 503, (route, r.status_code, r.data[:80])
        assert r.get_json()["error"] == "storage_unavailable"
    assert _thumbs(settings, image) == []


def test_a_fifo_in_place_of_the_file_is_refused_without_blocking(client, settings):
    image = upload(client, png_bytes(size=(64, 64))).get_json()["image"]
    path = _stored(settings, image)
    path.unlink()
    os.mkfifo(path)
    done = threading.Event()

    def unblock_a_stuck_reader() -> None:
        """If the request blocks on the FIFO (the bug), give it an end of file after a while, so the
        test fails instead of hanging."""
        deadline = time.monotonic() + 5
        while not done.wait(0.05):
            if time.monotonic() < deadline:
                continue
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: no reader (yet)
                continue

    helper = threading.Thread(target=unblock_a_stuck_reader, daemon=True)
    helper.start()
    try:
        started = time.monotonic()
        r = client.get(f"/api/v1/images/{image['id']}/content")
        took = time.monotonic() - started
    finally:
        done.set()
        helper.join(timeout=10)
    assert r.status_code == 503 and r.get_json()["error"] == "storage_unavailable"
    assert took < 5, "the request waited on the FIFO"


def test_the_ops_page_serves_no_tampered_original_either(client, settings):
    image = upload(client, png_bytes(size=(64, 64))).get_json()["image"]
    path = _stored(settings, image)
    original = path.read_bytes()
    _flip_a_byte(path)
    r = client.get(f"/ops/images/{image['id']}/content")
    assert r.status_code == 503, (r.status_code, r.data[:80])
    assert r.get_json()["error"] == "storage_corrupt"
    path.write_bytes(original)
    r = client.get(f"/ops/images/{image['id']}/content")
    assert r.status_code == 200 and r.data == original


def _lookalike_by_file(client, data: bytes) -> dict[str, dict]:
    r = client.post("/api/v1/search/visual", data={"file": (io.BytesIO(data), "q.png"), "limit": "5"},
                    content_type="multipart/form-data")
    assert r.status_code == 200, r.get_json()
    return {h["image"]["id"]: h for h in r.get_json()["items"]}


def test_a_search_by_id_embeds_no_tampered_original_on_the_fly(client, settings):
    """Searching by an ``image_id`` not embedded yet embeds its stored file on the fly: other bytes
    there (another valid picture) were embedded and searched by as if they were the image."""
    image = upload(client, png_bytes(size=(64, 64)), process=False).get_json()["image"]
    path = _stored(settings, image)
    original = path.read_bytes()
    path.write_bytes(png_bytes(color=(0, 0, 255), size=(64, 64)))  # another valid image
    r = client.post("/api/v1/search/visual", json={"image_id": image["id"]})
    assert r.status_code == 503, (r.status_code, r.get_json())
    assert r.get_json()["error"] == "storage_corrupt"
    path.unlink()
    path.mkdir()  # not a regular file: a 503, not a 500
    r = client.post("/api/v1/search/visual", json={"image_id": image["id"]})
    assert (r.status_code, r.get_json()["error"]) == (503, "storage_unavailable")
    path.rmdir()
    path.write_bytes(original)  # restored from a backup: searched by again
    r = client.post("/api/v1/search/visual", json={"image_id": image["id"]})
    assert r.status_code == 200 and r.get_json()["items"] == []


def test_a_tampered_hit_is_ranked_by_its_vector_alone_and_poisons_no_cache(client, settings, orch, publisher):
    """The look-alike re-ranking compares the query's pixels with each hit's stored original: a hit
    whose file holds other bytes was scored (and its thumbnails cached for good under its sha256)
    from those bytes. It must keep its descriptor score alone (no ``pixels``) — the search still
    answers — and, once the file is restored, be compared by its own pixels."""
    from app.search import lookalike
    from tests.api.test_images import wait_job
    from tests.support.pipeline import Workers
    from tests.support.pipeline import png_bytes as seeded_png

    query, other = seeded_png(21, size=(64, 64)), seeded_png(22, size=(64, 64))
    with Workers(orch, publisher, n=1):
        body = upload(client, other).get_json()
        wait_job(client, body["job"]["id"])
    hit = body["image"]
    lookalike.CACHE._data.pop(hit["sha256"], None)  # a process-wide cache: this test's entry starts empty
    before = _lookalike_by_file(client, query)[hit["id"]]
    assert "pixels" in before and before["pixels"] < 0.99

    path = _stored(settings, hit)
    original = path.read_bytes()
    lookalike.CACHE._data.pop(hit["sha256"], None)
    path.write_bytes(query)  # the query's own pixels: a perfect (wrong) pixel match
    tampered = _lookalike_by_file(client, query)[hit["id"]]
    assert "pixels" not in tampered, tampered
    assert tampered["lookalike"] == tampered["score"] == before["score"]
    # by id, the tampered image as the query: its stored vector is searched by, with no pixel re-ranking
    r = client.post("/api/v1/search/visual", json={"image_id": hit["id"]})
    assert r.status_code == 200, r.get_json()
    assert all("pixels" not in h for h in r.get_json()["items"])
    path.unlink()
    path.mkdir()  # not a regular file: the search still answers (no 500), the hit unscored by pixels
    assert "pixels" not in _lookalike_by_file(client, query)[hit["id"]]
    path.rmdir()

    path.write_bytes(original)  # restored: compared by its own pixels again (nothing wrong was cached)
    assert _lookalike_by_file(client, query)[hit["id"]]["pixels"] == before["pixels"]
