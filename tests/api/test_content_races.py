"""Reading an image's bytes (or its thumbnail) while its content is replaced.

A replace commits the new row and then removes the old file, so a reader that read the row just
before can find that file gone. The image still exists: the reader must look at the row again and
serve the current version, not answer 404. Each test commits the replace exactly between the
reader's row read and its file read (a wrapper around ``FileStore.read``).
"""

from __future__ import annotations

import hashlib

from app.storage import storage_key
from tests.api.conftest import png_bytes, upload


def _replace_before_the_first_read(monkeypatch, orch, store, image_id: str, new: bytes) -> None:
    """The first read of a stored original (``FileStore.read_verified``, as every serving path
    reads) happens just after the image's content was replaced."""
    real_read = store.read_verified

    def read_after_a_replace(key: str) -> bytes:
        monkeypatch.setattr(store, "read_verified", real_read)  # once
        sha = hashlib.sha256(new).hexdigest()
        orch.replace_content(
            "local", image_id, sha256=sha, media_type="image/png", extension=".png", size_bytes=len(new),
            width=32, height=24, storage_key=storage_key(orch.ensure_scope("local"), sha, ".png"), files=store,
            data=new,
        )
        return real_read(key)

    monkeypatch.setattr(store, "read_verified", read_after_a_replace)


def test_content_read_while_the_image_is_replaced_serves_the_new_bytes(app, orch, store, monkeypatch):
    client = app.test_client()
    old, new = png_bytes((1, 2, 3)), png_bytes((4, 5, 6))
    image_id = upload(client, old).get_json()["image"]["id"]
    _replace_before_the_first_read(monkeypatch, orch, store, image_id, new)
    r = client.get(f"/api/v1/images/{image_id}/content")
    assert r.status_code == 200, r.get_json()
    assert r.data == new and r.headers["ETag"] == f'"{hashlib.sha256(new).hexdigest()}"'


def test_thumbnail_made_while_the_image_is_replaced_is_the_new_versions(app, orch, store, monkeypatch):
    client = app.test_client()
    old, new = png_bytes((1, 2, 3)), png_bytes((4, 5, 6))
    image_id = upload(client, old).get_json()["image"]["id"]
    _replace_before_the_first_read(monkeypatch, orch, store, image_id, new)
    r = client.get(f"/api/v1/images/{image_id}/thumbnail")
    assert r.status_code == 200, r.get_json()
    assert r.headers["ETag"].startswith(f'"{hashlib.sha256(new).hexdigest()}-')


def test_a_thumbnail_of_a_named_version_replaced_meanwhile_is_still_404(app, orch, store, monkeypatch):
    client = app.test_client()
    old, new = png_bytes((1, 2, 3)), png_bytes((4, 5, 6))
    image_id = upload(client, old).get_json()["image"]["id"]
    _replace_before_the_first_read(monkeypatch, orch, store, image_id, new)
    r = client.get(f"/api/v1/images/{image_id}/thumbnail?v={hashlib.sha256(old).hexdigest()}")
    assert r.status_code == 404 and r.get_json()["error"] == "not_found"
