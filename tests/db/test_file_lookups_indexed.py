"""Whether a stored file is still referenced is an index lookup, not a scan of every image: the
check runs under the file's lock on every image delete, every content replace, every failed
upload and for every gc candidate, so a sequential scan of ``images`` made each of them cost the
whole library (EXPLAIN-checked on a real PostgreSQL with thousands of images)."""

from __future__ import annotations

import re

from sqlalchemy import event, text

from app.cli.maintenance import collect_garbage
from app.orchestrator import Orchestrator
from app.storage import FileStore
from tests.support.pipeline import png_bytes, store_and_ingest


def test_file_reference_checks_are_index_lookups(engine, settings):
    orch = Orchestrator(engine, settings)
    res = store_and_ingest(orch, "local", png_bytes(5))
    ns = str(orch.ensure_scope("local"))
    with engine.begin() as conn:  # a library of 20,000 images, in 20 scopes
        conn.execute(text("INSERT INTO scopes (id, storage_namespace) SELECT 's' || g, gen_random_uuid()"
                          " FROM generate_series(1, 19) g"))
        conn.execute(text(
            "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
            " metadata_hash) SELECT md5('i' || g)::uuid, CASE WHEN g % 20 = 0 THEN 'local' ELSE 's' || g % 20 END,"
            " md5(g::text) || md5((g + 1)::text), '.png',"
            " 'image/png', 1, 1, 1, :ns || '/' || md5(g::text) || md5((g + 1)::text) || '.png', 'h'"
            " FROM generate_series(1, 20000) g"), {"ns": ns})
        conn.execute(text("ANALYZE images; ANALYZE scopes"))
    orphan = settings.storage_path / ns / f"{'c' * 64}.png"
    orphan.write_bytes(b"x")
    captured: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if re.search(r"storage_key\s*=", statement) and "images" in statement:
            captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        collect_garbage(orch, settings.storage_path, min_age_s=0, dry_run=True)  # the filter and the locked check
        orch.delete_image("local", res.image["id"], files=FileStore(settings.storage_path))  # the release
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert len(captured) >= 3, captured  # gc's filter, gc's locked check, the delete's release
    with engine.connect() as conn:
        for statement, parameters in captured:
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
            assert not re.search(r"Seq Scan on images", plan), (statement, plan)
            probe = re.search(r"Index (Only )?Scan using \S+ on images.*\n\s+Index Cond: (.*)", plan)
            assert probe and "scope_id" in probe.group(2) and "sha256" in probe.group(2), (statement, plan)
