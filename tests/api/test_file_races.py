"""No image row without its bytes: removals of files race uploads of the same bytes.

Each test loops many rounds of two threads started together through a barrier, on the real API
(its own test client per thread), real PostgreSQL and real files; after every round, every
committed image's file exists and no request failed with a 5xx.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from collections.abc import Callable

from sqlalchemy import text

from app.cli.maintenance import collect_garbage
from app.storage import storage_key
from tests.api.conftest import png_bytes, upload

ROUNDS = 40


def _race(*actions: Callable[[], object]) -> list[object]:
    """Run the actions in threads released together; their results (or exceptions), in order."""
    barrier = threading.Barrier(len(actions))
    results: list[object] = [None] * len(actions)

    def run(i: int, action: Callable[[], object]) -> None:
        barrier.wait()
        try:
            results[i] = action()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller's assertions
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(actions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def _rows_without_files(engine, store) -> list[str]:
    with engine.connect() as conn:
        keys = [k for (k,) in conn.execute(text("SELECT storage_key FROM images"))]
    return [k for k in keys if not store.path(k).is_file()]


def _bytes(round_no: int, variant: int = 0) -> bytes:
    return png_bytes(((round_no * 5) % 256, (round_no * 11 + variant * 97) % 256, 40 + variant), size=(40, 30))


def _status(result: object) -> int:
    if isinstance(result, BaseException):
        raise result
    return result.status_code  # type: ignore[attr-defined]


def test_deleting_an_image_while_its_bytes_are_uploaded_again_never_leaves_a_row_without_its_file(
    app, engine, store
):
    for n in range(ROUNDS):
        data = _bytes(n)
        created = upload(app.test_client(), data)
        assert created.status_code == 201
        image_id = created.get_json()["image"]["id"]
        deleted, uploaded = _race(lambda i=image_id: app.test_client().delete(f"/api/v1/images/{i}"),
                                  lambda d=data: upload(app.test_client(), d))
        assert _status(deleted) == 204 and _status(uploaded) in (200, 201), (n, uploaded)
        assert _rows_without_files(engine, store) == [], f"round {n}"


def test_replacing_an_image_while_its_old_bytes_are_uploaded_again_never_leaves_a_row_without_its_file(
    app, engine, store
):
    for n in range(ROUNDS):
        old, new = _bytes(n), _bytes(n, variant=1)
        created = upload(app.test_client(), old)
        assert created.status_code == 201
        image_id = created.get_json()["image"]["id"]
        replaced, uploaded = _race(
            lambda i=image_id, d=new: app.test_client().put(
                f"/api/v1/images/{i}/content", data={"file": (io.BytesIO(d), "n.png")},
                content_type="multipart/form-data"),
            lambda d=old: upload(app.test_client(), d),
        )
        assert _status(replaced) == 200 and _status(uploaded) in (200, 201), (n, uploaded)
        assert _rows_without_files(engine, store) == [], f"round {n}"


def test_gc_racing_a_reupload_of_an_old_orphan_never_leaves_a_row_without_its_file(app, orch, engine, store, settings):
    namespace = orch.ensure_scope("local")
    for n in range(ROUNDS):
        data = _bytes(n)
        key = storage_key(namespace, hashlib.sha256(data).hexdigest(), ".png")
        store.write(key, data)  # an orphan: its upload crashed before its row committed, long ago
        past = time.time() - 7200
        os.utime(store.path(key), (past, past))
        collected, uploaded = _race(
            lambda: collect_garbage(orch, settings.storage_path, min_age_s=60, dry_run=False),
            lambda d=data: upload(app.test_client(), d),
        )
        if isinstance(collected, BaseException):
            raise collected
        assert _status(uploaded) == 201, (n, uploaded)
        assert _rows_without_files(engine, store) == [], f"round {n}"
    # and what gc may still remove is only ever unreferenced: a final run keeps every referenced file
    collect_garbage(orch, settings.storage_path, min_age_s=0, dry_run=False)
    assert _rows_without_files(engine, store) == []


def test_an_upload_of_existing_bytes_refreshes_the_file_age_gc_goes_by(app, orch, engine, store, settings):
    data = _bytes(1)
    first = upload(app.test_client(), data)
    key = _key_of(engine, first.get_json()["image"]["id"])
    past = time.time() - 7200
    os.utime(store.path(key), (past, past))
    assert upload(app.test_client(), data).status_code == 200  # identical bytes: the existing image
    assert time.time() - store.path(key).stat().st_mtime < 600


def test_a_failed_upload_leaves_no_file_and_a_deleted_image_takes_its_file(app, orch, engine, store, monkeypatch):
    client = app.test_client()
    data = _bytes(2)
    r = upload(client, data, reverse_image_policy="auto")
    image_id = r.get_json()["image"]["id"]
    key = _key_of(engine, image_id)
    # same bytes, another policy while the auto job is active: 409 — the file stays (the row uses it)
    assert upload(client, data, reverse_image_policy="forbid").status_code == 409
    assert store.path(key).is_file()
    assert client.delete(f"/api/v1/images/{image_id}").status_code == 204
    assert not store.path(key).is_file() and list(store.iter_keys()) == []


def test_an_upload_whose_transaction_fails_after_writing_its_file_removes_it(app, store, monkeypatch):
    from app.orchestrator import changes

    def boom(*args, **kwargs):
        raise RuntimeError("the database failed mid-transaction")

    monkeypatch.setattr(changes, "create_or_reuse_job_txn", boom)  # after the file write, before commit
    r = upload(app.test_client(), _bytes(3))
    assert r.status_code == 500 and r.get_json()["error"] == "internal_error"
    assert list(store.iter_keys()) == [] and not store.stale_temp_files()


def _key_of(engine, image_id: str) -> str:
    with engine.connect() as conn:
        return conn.execute(text("SELECT storage_key FROM images WHERE id = :i"), {"i": image_id}).scalar_one()
