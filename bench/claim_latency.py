"""Claim latency as the backlog grows, and sweep time as a function of due work (SPEC §9).

For each backlog size B (default 10k, 100k, 1M) the script fills a fresh database with B queued
tasks (plus their jobs and stages, by SQL in bulk), then times:
  * ``claim_task`` by id (the hint path) — p50/p99 over 300 claims of random queued tasks;
  * ``claim_batch("embedding", 16)`` (the batched lane) — p50/p99 over 100 batches;
  * ``claim_with_batch(id, "embedding", 16)`` (a live hint of a batched lane: the hinted task, its
    wake-up group, topped up to 16) — p50/p99 over 100 hints of tasks still queued;
  * one reconcile sweep with D tasks due for a re-hint (D = 0, 100, 500; the sweep's LIMIT is 500).
Prints a markdown table. Uses the embedded PostgreSQL under a temp dir (fsync on).

    python bench/claim_latency.py [--sizes 10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg2  # noqa: E402
from sqlalchemy import text  # noqa: E402

from app.config import Settings  # noqa: E402
from app.db.engine import make_engine, upgrade_to_head  # noqa: E402
from app.embedded import EmbeddedServices  # noqa: E402
from app.orchestrator import Orchestrator, StageConfigs  # noqa: E402

CONFIGS = StageConfigs(
    visual={"model": "m", "preprocess_version": "p", "dims": 4}, agent={"provider": "a", "model": "m"},
    text={"model": "t", "dims": 4, "document_version": "1"},
)

# One transaction. The images go in with the usage trigger off and the scope's usage is set once
# after: the trigger's 1M updates of one ``scope_usage`` row in one transaction would each walk the
# row's growing chain of versions (the 1M fill ran > 20 min: docs/performance-log.md §46, §48).
# Uploads are one per transaction.
FILL = """
INSERT INTO scopes (id, storage_namespace) VALUES ('bench', gen_random_uuid()) ON CONFLICT DO NOTHING;
ALTER TABLE images DISABLE TRIGGER images_scope_usage;
INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key)
  SELECT gen_random_uuid(), 'bench', md5(g::text) || md5((g + 1)::text), '.png', 'image/png', 1, 1, 1, 'k'
  FROM generate_series(1, :n) g;
ALTER TABLE images ENABLE TRIGGER images_scope_usage;
INSERT INTO scope_usage (scope_id, image_count, stored_bytes)
  SELECT scope_id, count(*), sum(size_bytes) FROM images GROUP BY scope_id
  ON CONFLICT (scope_id) DO UPDATE SET image_count = EXCLUDED.image_count, stored_bytes = EXCLUDED.stored_bytes;
INSERT INTO processing_jobs (id, scope_id, image_id, revision, image_sha256, config, config_hash,
    reverse_image_policy, mode, status, current_stage)
  SELECT gen_random_uuid(), scope_id, id, 1, sha256, '{}', 'h', 'forbid', 'auto', 'queued', 'text_embedding'
  FROM images;
INSERT INTO tasks (id, scope_id, job_id, stage, lane, payload, input_fingerprint, dedupe_key, image_id,
    image_sha256, status, max_attempts, last_hint_at)
  SELECT gen_random_uuid(), j.scope_id, j.id, 'text_embedding', 'embedding', '{}', 'f', md5(j.id::text), j.image_id,
    j.image_sha256, 'queued', 5, now()
  FROM processing_jobs j;
INSERT INTO job_stages (job_id, stage, scope_id, position, status, task_id)
  SELECT t.job_id, 'text_embedding', t.scope_id, 2, 'queued', t.id FROM tasks t;
ANALYZE;
"""


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="memeflow-claimbench-", dir="/tmp"))
    root.chmod(0o755)
    svc = EmbeddedServices(root / "var")
    urls = svc.start()
    rows = []
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            name = f"claim_{size}"
            admin = psycopg2.connect(svc.postgres_url("postgres").replace("+psycopg2", ""))
            admin.autocommit = True
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
            admin.cursor().execute(f"CREATE DATABASE {name}")
            admin.close()
            url = svc.postgres_url(name)
            upgrade_to_head(url)
            engine = make_engine(url, pre_ping=False)
            t0 = time.perf_counter()
            with engine.begin() as conn:
                conn.execute(text("SET LOCAL statement_timeout = 0"))  # the engine's timeout is for the app, not a 1M fill
                for statement in FILL.split(";\n"):
                    if statement.strip():
                        conn.execute(text(statement), {"n": size})
            fill_s = time.perf_counter() - t0
            settings = Settings(database_url=url, broker_url=urls.broker_url, var_dir=root / "var",
                                rehint_grace_s=3600, agent_lane_limit=0)
            orch = Orchestrator(engine, settings, stage_configs=CONFIGS)
            with engine.connect() as conn:
                ids = [r[0] for r in conn.execute(text("SELECT id FROM tasks ORDER BY random() LIMIT 300"))]
            single = []
            for task_id in ids:
                t = time.perf_counter()
                assert orch.claim_task(task_id, "bench") is not None
                single.append(time.perf_counter() - t)
            batch = []
            for _ in range(100):
                t = time.perf_counter()
                assert len(orch.claim_batch("embedding", 16, "bench")) == 16
                batch.append(time.perf_counter() - t)
            group = []
            for _ in range(100):
                with engine.connect() as conn:  # a task still queued now (earlier top-ups took others)
                    task_id = conn.execute(text("SELECT id FROM tasks WHERE status = 'queued' OFFSET :o LIMIT 1"),
                                           {"o": random.randrange(1000)}).scalar_one()
                t = time.perf_counter()
                assert len(orch.claim_with_batch(task_id, "embedding", 16, "bench").claims) == 16
                group.append(time.perf_counter() - t)
            sweeps = {}
            for due in (0, 100, 500):
                with engine.begin() as conn:  # only the previous step's re-hinted rows need resetting
                    conn.execute(text("UPDATE tasks SET last_hint_at = now() WHERE status = 'queued'"
                                      " AND last_hint_at < now() - interval '30 minutes'"))
                    conn.execute(text(
                        "UPDATE tasks SET last_hint_at = now() - interval '2 hours' WHERE id IN"
                        " (SELECT id FROM tasks WHERE status = 'queued' LIMIT :d)"), {"d": due})
                t = time.perf_counter()
                report = orch.sweep()
                sweeps[due] = (time.perf_counter() - t, report.counts.get("rehinted", 0))
            with engine.connect() as conn:  # the one sweep step whose cost follows the backlog
                t = time.perf_counter()
                conn.execute(text("SELECT lane, count(*) FROM tasks WHERE status IN ('queued', 'running') GROUP BY lane"))
                gauges_ms = (time.perf_counter() - t) * 1000
            print(f"backlog {size}: gauge query {gauges_ms:.1f} ms", flush=True)
            rows.append((size, fill_s, single, batch, group, sweeps))
            engine.dispose()
            print(f"backlog {size}: filled in {fill_s:.1f}s", flush=True)
    finally:
        svc.stop()
        shutil.rmtree(root, ignore_errors=True)
    print("\n| queued backlog | claim_task p50 / p99 ms | claim_batch(16) p50 / p99 ms |"
          " claim_with_batch(hint, 16) p50 / p99 ms | sweep ms with 0 / 100 / 500 due |")
    print("|---|---|---|---|---|")
    for size, _fill, single, batch, group, sweeps in rows:
        sw = " / ".join(f"{sweeps[d][0] * 1000:.1f}" for d in (0, 100, 500))
        print(f"| {size:,} | {pct(single, .5):.2f} / {pct(single, .99):.2f} | {pct(batch, .5):.2f} / {pct(batch, .99):.2f}"
              f" | {pct(group, .5):.2f} / {pct(group, .99):.2f} | {sw} |")
    print(f"\n(rehinted per sweep: {[rows[-1][5][d][1] for d in (0, 100, 500)]}; median of {len(rows[0][2])} claims)")



if __name__ == "__main__":
    main()
