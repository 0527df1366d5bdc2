"""The content-addressed file store, and file cleanup when the upload's DB step fails."""

from __future__ import annotations

import uuid

import pytest

from app.storage import FileStore, InvalidStorageKey, storage_key
from tests.api.conftest import png_bytes, upload


def test_store_write_read_delete_orphans(tmp_path):
    store = FileStore(tmp_path / "s")
    ns = uuid.uuid4()
    key = storage_key(ns, "a" * 64, ".png")
    assert key == f"{ns}/{'a' * 64}.png"
    assert store.write(key, b"one") is True
    assert store.write(key, b"one") is False  # content addressed: already there
    assert store.read(key) == b"one"
    other = storage_key(ns, "b" * 64, "jpg")
    store.write(other, b"two")
    assert sorted(store.iter_keys()) == sorted([key, other])
    assert store.orphans([key]) == [other]
    assert store.delete(other) is True and store.delete(other) is False
    assert store.stale_temp_files() == []
    for bad in ("../etc/passwd", f"{ns}/../../x.png", "local/" + "a" * 64 + ".png", f"{ns}/{'a' * 64}"):
        with pytest.raises(InvalidStorageKey):
            store.path(bad)


def test_failed_ingest_removes_the_new_file(client, orch, store, monkeypatch, engine):
    def boom(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(orch, "ingest_image", boom)
    r = upload(client, png_bytes())
    assert r.status_code == 500 and r.get_json() == {"error": "internal_error", "message": "internal server error"}
    assert list(store.iter_keys()) == []


def test_failed_ingest_keeps_a_file_another_image_uses(client, orch, store, monkeypatch):
    data = png_bytes()
    assert upload(client, data).status_code == 201
    monkeypatch.setattr(orch, "ingest_image", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    assert upload(client, data).status_code == 500
    assert len(list(store.iter_keys())) == 1
