"""``memeflow gc --min-age 0`` while writes are in flight: a temp file that a live write still
holds (an upload's original, a thumbnail, an agent result record — each written as temp file,
fsync, rename) is never removed from under it; only abandoned ones (a crashed writer's) go.

Each test stops one real write between its temp file and its rename (a gate on ``os.replace``,
the real call made once the gate opens), runs gc in full, then lets the write finish."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from app.cli.maintenance import collect_garbage
from app.stages.agent import records
from app.stages.base import AgentResult
from app.thumbnails import ThumbnailCache
from tests.api.conftest import png_bytes, upload


class _Gate:
    """Holds the first ``os.replace`` of a temp file named ``prefix…`` until ``open()``."""

    def __init__(self, monkeypatch, prefix: str) -> None:
        self.reached, self.go = threading.Event(), threading.Event()
        self.paused: Path | None = None
        real = os.replace

        def replace(src, dst, *a, **k):
            if self.paused is None and Path(src).name.startswith(prefix):
                self.paused = Path(src)
                self.reached.set()
                assert self.go.wait(60)
            return real(src, dst, *a, **k)

        monkeypatch.setattr(os, "replace", replace)

    def run(self, action: Callable[[], object]) -> tuple[threading.Thread, list]:
        out: list = []

        def target():
            try:
                out.append(action())
            except BaseException as exc:  # noqa: BLE001 - asserted by the test
                out.append(exc)

        thread = threading.Thread(target=target)
        thread.start()
        assert self.reached.wait(60), out
        return thread, out

    def open(self, thread: threading.Thread) -> None:
        self.go.set()
        thread.join(60)


@pytest.fixture()
def gate(monkeypatch):
    """A gate factory; every gate opens at teardown, so no write is left waiting."""
    made: list[_Gate] = []

    def make(prefix: str) -> _Gate:
        made.append(_Gate(monkeypatch, prefix))
        return made[-1]

    yield make
    for g in made:
        g.go.set()


@pytest.fixture()
def old_orphans(settings, orch):
    """An abandoned temp file of a crashed write in each place gc looks (they must still go)."""
    ns = str(orch.ensure_scope("local"))
    paths = [settings.storage_path / ns / ".tmp-crashed", settings.storage_path / ".thumbs" / ns / ".tmp-crashed",
             settings.agent_results_path / ns / ".crashed.tmp"]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    return paths


def _gc(orch, settings, ns: str) -> None:
    collect_garbage(orch, settings.storage_path, min_age_s=0, dry_run=False)
    ThumbnailCache(settings.storage_path).prune([], min_age_s=0, namespaces={ns})
    records.prune(settings.agent_results_path, orch.open_attempt_ids, min_age_s=0, namespaces={ns})


def test_gc_spares_the_temp_file_of_an_upload_in_flight(app, orch, settings, gate, old_orphans):
    ns = str(orch.ensure_scope("local"))
    gate = gate(".tmp-")
    client = app.test_client()
    thread, out = gate.run(lambda: upload(client, png_bytes((3, 1, 4))))
    assert gate.paused is not None and gate.paused.exists()
    _gc(orch, settings, ns)
    assert gate.paused.exists()
    gate.open(thread)
    assert out and not isinstance(out[0], BaseException) and out[0].status_code == 201, out
    image = out[0].get_json()["image"]
    assert client.get(f"/api/v1/images/{image['id']}/content").status_code == 200
    assert not any(p.exists() for p in old_orphans)


def test_gc_spares_the_temp_file_of_a_thumbnail_in_flight(app, orch, settings, gate, old_orphans):
    ns = str(orch.ensure_scope("local"))
    client = app.test_client()
    image = upload(client, png_bytes((2, 7, 1), size=(300, 300))).get_json()["image"]
    gate = gate(".tmp-")
    thread, out = gate.run(lambda: client.get(f"/api/v1/images/{image['id']}/thumbnail?size=128"))
    assert gate.paused is not None and ".thumbs" in gate.paused.parts
    _gc(orch, settings, ns)
    assert gate.paused.exists()
    gate.open(thread)
    assert out and not isinstance(out[0], BaseException) and out[0].status_code == 200, out
    assert ThumbnailCache(settings.storage_path).path(ns, image["sha256"], 128).exists()
    assert not any(p.exists() for p in old_orphans)


def test_gc_spares_the_temp_file_of_an_agent_record_in_flight(orch, settings, gate, old_orphans):
    ns = str(orch.ensure_scope("local"))
    attempt_id = "ef" * 16
    gate = gate(f".{attempt_id}.")

    def write():
        with records.in_namespace(ns):
            return records.ResultRecords(settings.agent_results_path).write(
                attempt_id, AgentResult(context={}, model="m", request_id="r"))

    thread, out = gate.run(write)
    _gc(orch, settings, ns)
    assert gate.paused is not None and gate.paused.exists()
    gate.open(thread)
    assert out and isinstance(out[0], Path) and out[0].exists(), out
    assert not any(p.exists() for p in old_orphans)
