"""``memeflow gc`` decides only over the storage namespaces its database owns: run against a
database that does not own the storage directory (another environment's, a fresh one, an old
restore), it removes nothing there — originals, temp files, agent records, thumbnails — and says so."""

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


def _gc(settings, *args: str):
    reset_settings(settings)
    try:
        return CliRunner().invoke(main, ["gc", *args])
    finally:
        reset_settings(None)


def _age(*paths: Path) -> None:
    past = time.time() - 7200  # two hours ago: older than gc's default --min-age
    for path in paths:
        os.utime(path, (past, past))


def test_gc_removes_nothing_of_a_namespace_no_scope_of_its_database_owns(engine, settings, fresh_db, template_db):
    orch = Orchestrator(engine, settings)
    data = png_bytes(41)
    res = store_and_ingest(orch, "local", data)
    ns = str(orch.ensure_scope("local"))
    storage = settings.storage_path
    original = next((storage / ns).glob("*.png"))
    orphan = storage / ns / f"{'a' * 64}.png"  # a file no image row references
    temp = storage / ns / ".tmp-crashed-write"
    for path in (orphan, temp):
        path.write_bytes(b"x" * 10)
    with records.in_namespace(ns):  # a left-behind record of an attempt long settled
        record = records.ResultRecords(settings.agent_results_path).write(
            "ab" * 16, AgentResult(context={}, model="m", request_id="r"))
    cache = ThumbnailCache(storage)
    cache.get_or_create(ns, res.image["sha256"], 256, lambda: data)
    thumb = cache.path(ns, res.image["sha256"], 256)
    everything = (original, orphan, temp, record, thumb)
    _age(*everything)

    elsewhere = settings.replace(database_url=fresh_db(template_db))  # e.g. another environment's URL
    result = _gc(elsewhere)
    assert result.exit_code == 0, result.output
    assert all(p.exists() for p in everything), [p for p in everything if not p.exists()]
    assert "removed 0 unreferenced files and 0 temp files" in result.output
    assert f"not owned by this database, left alone: {ns}" in result.output

    result = _gc(settings)  # the owner's gc still collects
    assert result.exit_code == 0, result.output
    assert "removed 1 unreferenced files and 1 temp files" in result.output and "not owned" not in result.output
    assert not orphan.exists() and not temp.exists() and not record.exists()
    assert original.exists() and thumb.exists()
