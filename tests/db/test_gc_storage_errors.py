"""``memeflow gc`` on storage it cannot change (a read-only mount, a real EROFS from a small
tmpfs): every file it would remove is reported with the reason, the rest of the pass still
runs, and it exits 1 with a clear message — never a traceback."""

from __future__ import annotations

import os
import time
from pathlib import Path

from click.testing import CliRunner

from app.cli import main
from app.config import reset_settings
from app.orchestrator import Orchestrator
from app.stages.agent import records
from app.stages.base import AgentResult
from app.thumbnails import ThumbnailCache
from tests.support.pipeline import png_bytes, store_and_ingest
from tests.support.smallfs import remount_read_only, small_fs


def _gc(settings, *args: str):
    reset_settings(settings)
    try:
        return CliRunner().invoke(main, ["gc", *args])
    finally:
        reset_settings(None)


def _age(*paths: Path) -> None:
    past = time.time() - 7200
    for path in paths:
        os.utime(path, (past, past))


def test_gc_on_read_only_storage_reports_each_file_and_exits_1(engine, settings):
    with small_fs(settings.storage_path) as storage:
        orch = Orchestrator(engine, settings)
        data = png_bytes(43)
        res = store_and_ingest(orch, "local", data)
        ns = str(orch.ensure_scope("local"))
        original = next((storage / ns).glob("*.png"))
        orphan = storage / ns / f"{'b' * 64}.png"
        temp = storage / ns / ".tmp-crashed-write"
        for path in (orphan, temp):
            path.write_bytes(b"x" * 10)
        with records.in_namespace(ns):
            record = records.ResultRecords(settings.agent_results_path).write(
                "cd" * 16, AgentResult(context={}, model="m", request_id="r"))
        cache = ThumbnailCache(storage)
        cache.get_or_create(ns, "e" * 64, 256, lambda: data)  # a version no image has
        thumb = cache.path(ns, "e" * 64, 256)
        _age(original, orphan, temp, record, thumb)
        remount_read_only(storage)

        result = _gc(settings)
        assert result.exit_code == 1, result.output
        assert not isinstance(result.exception, OSError), result.exception  # no traceback
        out = result.output
        for path in (orphan, temp, record, thumb):
            assert f"could not remove {path}: Read-only file system" in out, out
            assert path.exists()
        assert original.exists() and res.image["sha256"]
        assert "removed 0 unreferenced files and 0 temp files" in out
