"""Look-alike re-ranking while a hit's content is replaced.

The pixel thumbnails of a hit are cached by the hit's sha256 (bytes never change under a sha256).
A replace committing between the index search and the hits' storage-key read must not put the
new bytes' thumbnails under the old sha256: a later image with the old bytes would be re-ranked by
another picture's pixels.
"""

from __future__ import annotations

import hashlib
import io

from app.api import search_queries
from app.search import lookalike
from app.storage import storage_key
from tests.api.test_images import wait_job
from tests.support.pipeline import Workers, png_bytes


def _lookalike(client, data: bytes) -> list[dict]:
    r = client.post("/api/v1/search/visual", data={"file": (io.BytesIO(data), "q.png"), "limit": "5"},
                    content_type="multipart/form-data")
    assert r.status_code == 200, r.get_json()
    return r.get_json()["items"]


def _upload(client, data: bytes) -> dict:
    r = client.post("/api/v1/images", data={"file": (io.BytesIO(data), "x.png")}, content_type="multipart/form-data")
    assert r.status_code in (200, 201), r.get_json()
    return r.get_json()


def test_a_hit_replaced_during_the_rerank_leaves_no_wrong_thumbnails(client, orch, publisher, store, monkeypatch):
    old, new = png_bytes(3, size=(64, 64)), png_bytes(11, size=(64, 64))
    old_sha, new_sha = hashlib.sha256(old).hexdigest(), hashlib.sha256(new).hexdigest()
    with Workers(orch, publisher, n=1):
        body = _upload(client, old)
        wait_job(client, body["job"]["id"])
    image_id = body["image"]["id"]
    lookalike.CACHE._data.pop(old_sha, None)  # a process-wide cache: this test's entry starts empty

    real = search_queries.storage_keys

    def replaced_first(engine, scope, *args, **kwargs):
        monkeypatch.setattr(search_queries, "storage_keys", real)  # once
        replaced = orch.replace_content("local", image_id, sha256=new_sha, media_type="image/png", extension=".png",
                             size_bytes=len(new), width=64, height=64,
                             storage_key=storage_key(orch.ensure_scope("local"), new_sha, ".png"), files=store,
                             data=new)
        publisher.publish(replaced.hints)
        return real(engine, scope, *args, **kwargs)

    monkeypatch.setattr(search_queries, "storage_keys", replaced_first)
    hits = _lookalike(client, old)  # the index still has the old version of the image
    assert [h["image"]["sha256"] for h in hits] == [old_sha]

    with Workers(orch, publisher, n=1):  # the old bytes come back as another image
        again = _upload(client, old)
        wait_job(client, again["job"]["id"])
    hits = _lookalike(client, old)
    top = hits[0]
    assert (top["image"]["id"], top["image"]["sha256"]) == (again["image"]["id"], old_sha)
    assert top["pixels"] > 0.999, "the old bytes were re-ranked by the replacement's pixels"


def test_search_by_id_while_the_image_is_replaced_searches_the_new_version(client, orch, publisher, store,
                                                                           monkeypatch):
    """Searching by ``image_id`` before the image is embedded reads its stored bytes; a replace that
    commits between the row read and the file read removes that file. The image still exists: the
    search reads the row again and queries by the current version, never a 404."""
    old, new = png_bytes(3, size=(64, 64)), png_bytes(11, size=(64, 64))
    new_sha = hashlib.sha256(new).hexdigest()
    r = client.post("/api/v1/images", data={"file": (io.BytesIO(old), "x.png"), "process": "false"},
                    content_type="multipart/form-data")
    image_id = r.get_json()["image"]["id"]
    with Workers(orch, publisher, n=1):  # a neighbour to find
        neighbour = _upload(client, png_bytes(12, size=(64, 64)))
        wait_job(client, neighbour["job"]["id"])
    real_read = store.read_verified  # the search reads the stored bytes verified (app/api/stored.py)

    def read_after_a_replace(key: str) -> bytes:
        monkeypatch.setattr(store, "read_verified", real_read)  # once
        orch.replace_content("local", image_id, sha256=new_sha, media_type="image/png", extension=".png",
                             size_bytes=len(new), width=64, height=64,
                             storage_key=storage_key(orch.ensure_scope("local"), new_sha, ".png"), files=store,
                             data=new)
        return real_read(key)

    monkeypatch.setattr(store, "read_verified", read_after_a_replace)
    r = client.post("/api/v1/search/visual", json={"image_id": image_id})
    assert r.status_code == 200, r.get_json()
    hits = r.get_json()["items"]
    assert [h["image"]["id"] for h in hits] == [neighbour["image"]["id"]]
    by_file = [h for h in _lookalike(client, new) if h["image"]["id"] == neighbour["image"]["id"]]
    assert hits[0]["pixels"] == by_file[0]["pixels"]  # the query was the replacement's pixels
