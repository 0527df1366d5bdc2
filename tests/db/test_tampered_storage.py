"""The image file changed under the worker after upload (docs/operations.md, "file_corrupt").

Each tampering is run through the worker's own hint handling (``handle_hint``, what the Celery
task calls) with an injected clock: the stage ends failed with a stable code — ``file_corrupt``
at once for bytes that are not the image's (truncated, replaced, a symlink to other bytes), or
``file_missing`` / ``file_unreadable`` once its retries are spent for a file that is gone or cannot
be read (a directory, a FIFO, a device, permission denied) — and no artifact is ever written from
bytes other than the ones the image's sha256 names. Nothing hangs, nothing loops.
"""

from __future__ import annotations

import os
import threading

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.support.clock import FakeClock
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task

MAX_ATTEMPTS = 3


@pytest.fixture()
def world(engine, settings):
    settings = settings.replace(max_attempts=MAX_ATTEMPTS)
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    res = store_and_ingest(orch, "local", png_bytes(41))
    with engine.connect() as conn:
        key = conn.execute(text("SELECT storage_key FROM images WHERE id = :i"), {"i": res.image["id"]}).scalar()
    path = settings.storage_path / key
    return orch, res, path, clock


def _run_until_terminal(orch, res, clock, timeout_s: float = 30.0) -> dict:
    """Hand the visual task's hint to the worker code until its stage is terminal (each run in a
    thread with a deadline: a read that blocks fails the test instead of hanging it)."""
    hint = visual_task(res)
    providers = Providers(orch.settings)
    for _ in range(MAX_ATTEMPTS + 2):
        done = threading.Event()

        def run(done: threading.Event = done) -> None:
            handle_hint(orch, "visual", hint.task_id, "w", providers, RecordingPublisher())
            done.set()

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        assert done.wait(timeout_s), "the worker blocked reading the stored file"
        job = orch.get_job("local", res.job["id"])
        stage = job["stages"][0]
        if stage["status"] not in ("queued", "running", "pending"):
            return job
        clock.advance(3600)  # past any backoff
    raise AssertionError(f"the visual stage never ended: {job}")


def _visual_rows(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM visual_embeddings")).scalar()


def _assert_failed(job: dict, code: str, attempts: int) -> None:
    assert job["status"] == "failed", job
    assert job["error"]["code"] == code, job["error"]
    assert job["stages"][0]["status"] == "failed"
    assert job["stages"][0]["attempt_count"] == attempts


def test_bytes_replaced_by_another_valid_image_write_no_artifact(engine, world):
    orch, res, path, clock = world
    path.write_bytes(png_bytes(42))  # decodes fine: only the sha256 tells it is not this image
    _assert_failed(_run_until_terminal(orch, res, clock), "file_corrupt", 1)
    assert _visual_rows(engine) == 0


def test_a_truncated_file_fails_file_corrupt_at_once(engine, world):
    orch, res, path, clock = world
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _assert_failed(_run_until_terminal(orch, res, clock), "file_corrupt", 1)
    assert _visual_rows(engine) == 0


def test_a_symlink_out_of_the_storage_to_other_bytes_fails_file_corrupt(engine, world, tmp_path):
    orch, res, path, clock = world
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(png_bytes(43))
    path.unlink()
    path.symlink_to(outside)
    _assert_failed(_run_until_terminal(orch, res, clock), "file_corrupt", 1)
    assert _visual_rows(engine) == 0


def test_a_symlink_to_the_same_bytes_is_read(engine, world, tmp_path):
    orch, res, path, clock = world
    outside = tmp_path / "moved.png"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)  # an operator moved the file and linked it: the content is the image's
    job = _run_until_terminal(orch, res, clock)
    assert job["stages"][0]["status"] == "succeeded", job
    assert _visual_rows(engine) == 1


def test_a_deleted_file_fails_file_missing_after_its_retries(engine, world):
    orch, res, path, clock = world
    path.unlink()
    _assert_failed(_run_until_terminal(orch, res, clock), "file_missing", MAX_ATTEMPTS)
    assert _visual_rows(engine) == 0


def test_a_directory_in_its_place_fails_file_unreadable_after_its_retries(engine, world):
    orch, res, path, clock = world
    path.unlink()
    path.mkdir()
    _assert_failed(_run_until_terminal(orch, res, clock), "file_unreadable", MAX_ATTEMPTS)
    assert _visual_rows(engine) == 0


def test_a_fifo_in_its_place_is_refused_not_read_forever(engine, world):
    orch, res, path, clock = world
    path.unlink()
    os.mkfifo(path)
    try:
        _assert_failed(_run_until_terminal(orch, res, clock, timeout_s=10), "file_unreadable", MAX_ATTEMPTS)
    finally:  # unblock a reader the old code left waiting on the FIFO
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK) if _has_reader(path) else None
        if fd is not None:
            os.close(fd)
    assert _visual_rows(engine) == 0


def _has_reader(path) -> bool:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        return True
    except OSError:  # ENXIO: nobody has it open for reading
        return False


def test_a_symlink_to_a_device_is_refused(engine, world):
    orch, res, path, clock = world
    path.unlink()
    path.symlink_to("/dev/null")
    _assert_failed(_run_until_terminal(orch, res, clock), "file_unreadable", MAX_ATTEMPTS)
    assert _visual_rows(engine) == 0


def test_permission_denied_fails_file_unreadable_after_its_retries(engine, world, monkeypatch):
    orch, res, path, clock = world
    import app.storage

    real_open = os.open

    def denied(p, flags, *args, **kwargs):
        if str(p) == str(path):
            raise PermissionError(13, "Permission denied", str(p))
        return real_open(p, flags, *args, **kwargs)

    # the tests run as root, which a chmod does not stop: the open itself is refused
    monkeypatch.setattr(app.storage.os, "open", denied)
    _assert_failed(_run_until_terminal(orch, res, clock), "file_unreadable", MAX_ATTEMPTS)
    assert _visual_rows(engine) == 0
