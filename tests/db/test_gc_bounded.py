"""``memeflow gc`` reads the storage and asks the database a bounded chunk at a time: no statement
of a pass carries more than ``GC_CHUNK`` keys or returns more than that many rows, whatever the
library's size (it used to list every file into memory, send every key in one ``= ANY`` array and
read every image's version for the thumbnails) — and it still removes exactly the garbage."""

from __future__ import annotations

import os
import time

from click.testing import CliRunner
from sqlalchemy import Engine, event

from app.cli import main, maintenance
from app.config import reset_settings
from app.orchestrator import Orchestrator
from app.thumbnails import ThumbnailCache
from tests.support.pipeline import png_bytes, store_and_ingest

CHUNK = 3


def test_gc_works_through_the_storage_in_bounded_chunks(engine, settings, monkeypatch):
    orch = Orchestrator(engine, settings)
    storage = settings.storage_path
    images = [store_and_ingest(orch, "local", png_bytes(60 + i)).image for i in range(8)]
    ns = str(orch.ensure_scope("local"))
    cache = ThumbnailCache(storage)
    live_thumbs = [cache.get_or_create(ns, im["sha256"], 128, lambda: png_bytes(1)) and cache.path(ns, im["sha256"], 128)
                   for im in images]
    orphans = [storage / ns / f"{c * 64}.png" for c in "abcdef0"]
    dead_thumbs = [cache.path(ns, c * 64, 128) for c in "abcde"]
    for p in (*orphans, *dead_thumbs):
        p.write_bytes(b"x")
    past = time.time() - 7200
    for p in (*storage.joinpath(ns).iterdir(), *live_thumbs, *dead_thumbs):
        os.utime(p, (past, past))

    monkeypatch.setattr(maintenance, "GC_CHUNK", CHUNK)
    biggest: list[int] = []

    def before(conn, cursor, statement, parameters, context, executemany):
        sizes = [len(v) for v in (parameters or {}).values() if isinstance(v, (list, tuple))] if isinstance(
            parameters, dict) else []
        biggest.append(max(sizes, default=0))

    def after(conn, cursor, statement, parameters, context, executemany):
        if cursor.description is not None and "images" in statement:
            biggest.append(cursor.rowcount)

    event.listen(Engine, "before_cursor_execute", before)  # every engine: the command makes its own
    event.listen(Engine, "after_cursor_execute", after)
    reset_settings(settings)
    try:
        result = CliRunner().invoke(main, ["gc"])
    finally:
        reset_settings(None)
        event.remove(Engine, "before_cursor_execute", before)
        event.remove(Engine, "after_cursor_execute", after)
    assert result.exit_code == 0, result.output
    assert "removed 7 unreferenced files" in result.output and "removed 5 thumbnails" in result.output, result.output
    assert not any(p.exists() for p in (*orphans, *dead_thumbs))
    assert all(p.exists() for p in live_thumbs)
    assert all((storage / im_key).exists() for im_key in (f"{ns}/{im['sha256']}.png" for im in images))
    assert biggest and max(biggest) <= CHUNK, biggest
