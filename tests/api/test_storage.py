"""The content-addressed file store, and file cleanup when the upload's DB step fails."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

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


def test_upload_key_is_resolved_in_the_ingest_transaction(client, orch, store, engine):
    """The upload hands the orchestrator no key: the content-addressed key under the scope's
    namespace is resolved in the ingest transaction, and the file is stored under it."""
    data = png_bytes()
    r = upload(client, data)
    assert r.status_code == 201
    with engine.connect() as conn:
        key, sha, ns = conn.execute(text(
            "SELECT i.storage_key, i.sha256, s.storage_namespace FROM images i JOIN scopes s ON s.id = i.scope_id"
        )).one()
    assert key == storage_key(ns, sha, ".png")
    assert list(store.iter_keys()) == [key] and store.read(key) == data


def test_a_failure_after_the_file_is_stored_removes_it(client, orch, store, monkeypatch):
    from app.orchestrator import changes

    def boom(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(changes, "_insert_or_lock_image_txn", boom)
    r = upload(client, png_bytes())
    assert r.status_code == 500
    assert list(store.iter_keys()) == []
