"""The bytes the API serves or derives are the bytes it stored: a stored original whose bytes no
longer hash to the image's sha256 (overwritten, truncated, a symlink to other bytes) is never served
under an ETag naming that sha256, and no thumbnail is made — let alone cached for good — from it.
Such a file is a 503 ``storage_corrupt``; a file that is not a regular file (a directory, a FIFO)
is a 503 ``storage_unavailable`` without blocking; neither is a 500."""

from __future__ import annotations

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
