"""What a model change's cutover check costs per scope (docs/operations.md): for a scope of N images
with a context, every one embedded with the serving model and all but the newest with the target
(the worst case: the check scans the whole scope to find the one gap), time
  * the coverage count (``store.serving.coverage_txn``), what a check records for /ops and the CLI;
  * the conditional cutover UPDATE (``store.serving.cutover_txn``), refused because of the gap;
  * the fill batch's page scan (``store.serving_fill.fill_page_txn``, 500 images) at the scope's start.
Median of 5 runs each. Bulk-loaded by SQL into the embedded PostgreSQL under a temp dir.

    python bench/cutover_check.py [--sizes 10000,100000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg2  # noqa: E402
from sqlalchemy import text  # noqa: E402

from app.db.engine import make_engine, upgrade_to_head  # noqa: E402
from app.embedded import EmbeddedServices  # noqa: E402
from app.orchestrator.store import serving as q  # noqa: E402
from app.orchestrator.store import serving_fill  # noqa: E402

FILL = """
INSERT INTO scopes (id, storage_namespace) VALUES ('bench', gen_random_uuid()) ON CONFLICT DO NOTHING;
INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,
    metadata_hash, context_status, created_at)
  SELECT gen_random_uuid(), 'bench', md5(g::text) || md5((g + 1)::text), '.png', 'image/png', 1, 1, 1, 'k',
    md5(g::text), 'ready', now() - (:n - g) * interval '1 ms'
  FROM generate_series(1, :n) g;
INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims, document_version,
    document, embedding, status)
  SELECT scope_id, id, sha256, metadata_hash, m.model, 4, '1', 'doc', '[1,0,0,0]', 'ready'
  FROM images, (VALUES ('model-a'), ('model-b')) m(model);
DELETE FROM text_embeddings WHERE model = 'model-b'
  AND image_id = (SELECT id FROM images ORDER BY created_at DESC LIMIT 1);
INSERT INTO search_serving (scope_id, kind, state, serving_model, serving_dims, serving_ref, target_model,
    target_dims, target_ref)
  VALUES ('bench', 'text', 'backfill', 'model-a', 4, '{"model": "model-a", "dims": 4}', 'model-b', 4,
    '{"model": "model-b", "dims": 4}');
ANALYZE;
"""


def timed(fn, runs: int = 5) -> float:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="memeflow-cutoverbench-", dir="/tmp"))
    root.chmod(0o755)
    svc = EmbeddedServices(root / "var")
    svc.start()
    rows = []
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            name = f"cutover_{size}"
            admin = psycopg2.connect(svc.postgres_url("postgres").replace("+psycopg2", ""))
            admin.autocommit = True
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
            admin.cursor().execute(f"CREATE DATABASE {name}")
            admin.close()
            url = svc.postgres_url(name)
            upgrade_to_head(url)
            engine = make_engine(url, pre_ping=False)
            with engine.begin() as conn:
                for statement in FILL.split(";\n"):
                    if statement.strip():
                        conn.execute(text(statement), {"n": size})
            now = datetime.now(timezone.utc)

            def coverage(engine=engine, size=size):
                with engine.connect() as conn:
                    assert q.coverage_txn(conn, "bench", "text", "model-b", 4)["ready"] == size - 1

            def cutover(engine=engine, now=now):
                with engine.begin() as conn:
                    assert not q.cutover_txn(conn, "bench", target="model-b", target_dims=4, early=False,
                                             now=now).matched

            def fill_page(engine=engine, now=now):
                with engine.connect() as conn:
                    serving_fill.fill_page_txn(conn, "bench", [{"model": "model-b", "dims": 4}], now, None, 500)

            rows.append((size, timed(coverage), timed(cutover), timed(fill_page)))
            engine.dispose()
    finally:
        svc.stop()
        shutil.rmtree(root, ignore_errors=True)
    print("| images with a context | coverage count (ms) | cutover UPDATE, refused (ms) | fill page scan, 500 (ms) |")
    print("|---:|---:|---:|---:|")
    for size, cov, cut, page in rows:
        print(f"| {size:,} | {cov:.1f} | {cut:.1f} | {page:.1f} |")


if __name__ == "__main__":
    main()
