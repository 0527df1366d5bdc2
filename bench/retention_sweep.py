"""Sweep time as prunable history grows (retention, app/orchestrator/retention.py).

History is added in steps (by SQL in bulk) to one database until it holds each total of
``--sizes`` rows, a fifth of each kind: replaced jobs (10 revisions per image, all ended 40 days
ago), one ended task per job, one completed attempt per task, stale text embeddings (an older
metadata_hash) and per-minute ops_counters buckets — all older than the default retention ages.
At each size it times ``--sweeps`` full sweeps (retention on: each deletes its bounded batches),
each after a sweep with retention off (for reference: the same minute's load) and followed by one
with the default ``MEMEFLOW_RETENTION_BUDGET_MS``, and the WAL each
retention sweep writes (full-page images of the pages its deletes dirty: the work, whatever the
load). ``--keep DIR`` keeps the database (and reuses its history); ``--explain`` prints EXPLAIN
(ANALYZE, BUFFERS) of each kind's next step. Uses the embedded PostgreSQL under a temp dir (fsync on).

    python bench/retention_sweep.py [--sizes 0,100000,1000000,5000000] [--sweeps 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg2  # noqa: E402

from app.config import Settings  # noqa: E402
from app.db.engine import make_engine, upgrade_to_head  # noqa: E402
from app.embedded import EmbeddedServices  # noqa: E402
from app.orchestrator import Orchestrator, StageConfigs  # noqa: E402

CONFIGS = StageConfigs(
    visual={"model": "m", "preprocess_version": "p", "dims": 3}, agent={"provider": "a", "model": "m"},
    text={"model": "t", "dims": 3, "document_version": "1"},
)

# one step: images lo..hi-1, 10 replaced jobs each with a task and an attempt, 10 stale text
# embeddings each, and as many ops_counters buckets (minutes, 40+ days back)
FILL = """
INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key, metadata_hash)
  SELECT md5('i' || g)::uuid, 'bench', md5(g::text) || md5((g + 1)::text), '.png', 'image/png', 1, 1, 1, 'k', 'cur'
  FROM generate_series(%(lo)s, %(hi)s - 1) g;
INSERT INTO processing_jobs (id, scope_id, image_id, revision, image_sha256, config, config_hash,
    reverse_image_policy, mode, status, completed_at, updated_at)
  SELECT md5('j' || g || '-' || r)::uuid, 'bench', md5('i' || g)::uuid, r, md5(g::text) || md5((g + 1)::text),
    '{}', 'h', 'forbid', 'auto', CASE WHEN r = 10 THEN 'succeeded' ELSE 'superseded' END,
    now() - make_interval(days => 40, secs => g), now() - interval '40 days'
  FROM generate_series(%(lo)s, %(hi)s - 1) g, generate_series(1, 10) r;
INSERT INTO tasks (id, scope_id, job_id, stage, lane, payload, input_fingerprint, dedupe_key, image_id,
    image_sha256, status, max_attempts, completed_at)
  SELECT md5('t' || g || '-' || r)::uuid, 'bench', md5('j' || g || '-' || r)::uuid, 'visual', 'visual', '{}', 'f',
    md5('t' || g || '-' || r), md5('i' || g)::uuid, 'x', 'succeeded', 3, now() - make_interval(days => 40, secs => g)
  FROM generate_series(%(lo)s, %(hi)s - 1) g, generate_series(1, 10) r;
INSERT INTO task_attempts (attempt_id, scope_id, task_id, attempt_no, claim_generation, state, input_digest,
    target_sha256, updated_at)
  SELECT 'a' || g || '-' || r, 'bench', md5('t' || g || '-' || r)::uuid, 1, 1, 'completed', 'd', 's',
    now() - make_interval(days => 40, secs => g)
  FROM generate_series(%(lo)s, %(hi)s - 1) g, generate_series(1, 10) r;
INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims, document_version,
    document, embedding, created_at)
  SELECT 'bench', md5('i' || g)::uuid, md5(g::text) || md5((g + 1)::text), 'old' || r, 't', 3, '1', '', '[1,0,0]',
    now() - interval '40 days'
  FROM generate_series(%(lo)s, %(hi)s - 1) g, generate_series(1, 10) r;
INSERT INTO ops_counters (bucket, name, count)
  SELECT timestamptz '2026-01-01' - make_interval(mins => g * 10 + r), 'bench', 1
  FROM generate_series(%(lo)s, %(hi)s - 1) g, generate_series(1, 10) r
"""


def fill_statements(ids: str) -> list[str]:
    """FILL with random keys (``md5`` UUIDs, like uuid4) or time-ordered ones (``time``: a
    millisecond-like prefix growing with the row's creation order, then md5 bits, like the
    UUIDv7 ids ``app.ids.new_id`` gives images, jobs and tasks)."""
    text = FILL
    if ids == "time":
        for key, order in (("'i' || g", "g * 10"), ("'j' || g || '-' || r", "g * 10 + r"),
                           ("'t' || g || '-' || r", "g * 10 + r")):
            text = text.replace(f"md5({key})::uuid",
                                f"(lpad(to_hex(1700000000000 + {order}), 12, '0') || substr(md5({key}), 13))::uuid")
    return text.split(";\n")


def explain(engine, orch) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of every kind's next walk step, rolled back."""
    from datetime import timedelta

    from sqlalchemy import text

    from app.orchestrator.store import retention as q

    s, now = orch.settings, orch.now()
    params = {
        "jobs": {"cutoff": now - timedelta(seconds=s.retention_jobs_s)},
        "tasks": {"cutoff": now - timedelta(seconds=s.retention_tasks_s)},
        "attempts": {"cutoff": now - timedelta(seconds=s.retention_attempts_s)},
        "text_embeddings": {"stale_cutoff": now - timedelta(seconds=s.retention_embeddings_s), "model_cutoff": None,
                            "keep": ["t"], "keep_after": now},
    }
    for kind, p in params.items():
        statement, _step, _table = q.WALKS[kind]
        with engine.connect() as conn:
            page = q.walk_position_txn(conn, kind)
            _end, density = q.table_pages_txn(conn, kind)
            pages = max(1, -(-s.retention_scan_rows // int(density or 64)))
            plan = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + statement.text),
                                {"lo": f"({page},0)", "hi": f"({page + pages},0)", "n": s.retention_batch_size, **p})
            print(f"--- {kind} (pages {page}..{page + pages})")
            print("\n".join(r[0] for r in plan))
            conn.rollback()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="0,100000,1000000,5000000", help="history rows (all kinds together)")
    ap.add_argument("--sweeps", type=int, default=5)
    ap.add_argument("--ids", choices=("time", "random"), default="time",
                    help="keys of the generated images/jobs/tasks: time-ordered like the app's (default) or random")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep the database in this directory (and reuse the history already there)")
    ap.add_argument("--explain", action="store_true",
                    help="print EXPLAIN (ANALYZE, BUFFERS) of each kind's next walk step at each size (rolled back)")
    args = ap.parse_args()
    if args.keep:
        root = args.keep
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = Path(tempfile.mkdtemp(prefix="memeflow-retention-", dir="/tmp"))
    root.chmod(0o755)
    marker = root / "images"
    svc = EmbeddedServices(root / "var")
    urls = svc.start()
    rows = []
    try:
        url = urls.database_url
        upgrade_to_head(url)
        raw = psycopg2.connect(url.replace("+psycopg2", ""))
        raw.autocommit = True
        cur = raw.cursor()
        cur.execute("INSERT INTO scopes (id, storage_namespace) VALUES ('bench', gen_random_uuid())"
                    " ON CONFLICT DO NOTHING")
        engine = make_engine(url, pre_ping=False)
        base = Settings(database_url=url, broker_url=urls.broker_url, var_dir=root / "var", rehint_grace_s=3600)
        on = Orchestrator(engine, base.replace(retention_budget_ms=0.0), stage_configs=CONFIGS)
        budgeted = Orchestrator(engine, base, stage_configs=CONFIGS)  # MEMEFLOW_RETENTION_BUDGET_MS default
        off = Orchestrator(engine, base.replace(retention_jobs_s=0, retention_tasks_s=0, retention_attempts_s=0,
                                                retention_embeddings_s=0, retention_ops_counters_s=0),
                           stage_configs=CONFIGS)
        images = int(marker.read_text()) if marker.exists() else 0
        for size in [int(s) for s in args.sizes.split(",")]:
            want = size // 50  # 10 rows of each of 5 kinds per image
            if want > images:
                t0 = time.perf_counter()
                for lo in range(images, want, 20_000):
                    for statement in fill_statements(args.ids):
                        cur.execute(statement, {"lo": lo, "hi": min(want, lo + 20_000)})
                cur.execute("VACUUM ANALYZE")
                print(f"history {size:,}: filled in {time.perf_counter() - t0:.0f}s", flush=True)
                images = want
                marker.write_text(str(images))
            cur.execute("SELECT (SELECT count(*) FROM processing_jobs) + (SELECT count(*) FROM tasks)"
                        " + (SELECT count(*) FROM task_attempts) + (SELECT count(*) FROM text_embeddings)"
                        " + (SELECT count(*) FROM ops_counters)")
            present = cur.fetchone()[0]
            times_off, times_on, pruned, kinds, wal = [], [], 0, {}, []
            times_budget, pruned_budget = [], 0
            for _ in range(args.sweeps):  # interleaved: retention off, on without a budget, on with the default one
                t = time.perf_counter()
                off.sweep()
                times_off.append(time.perf_counter() - t)
                cur.execute("SELECT pg_current_wal_insert_lsn()")
                lsn = cur.fetchone()[0]
                t = time.perf_counter()
                report = on.sweep()
                times_on.append(time.perf_counter() - t)
                cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (lsn,))
                wal.append(float(cur.fetchone()[0]))
                pruned += sum(v for k, v in report.counts.items() if k.startswith("pruned_"))
                for k, v in report.counts.items():
                    if k.startswith("retention_ms_"):
                        kinds.setdefault(k[13:], []).append(v)
                t = time.perf_counter()
                report = budgeted.sweep()
                times_budget.append(time.perf_counter() - t)
                pruned_budget += sum(v for k, v in report.counts.items() if k.startswith("pruned_"))
            print("  ms per kind (median): " + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in kinds.items()))
            rows.append((size, present, times_off, times_on, pruned, statistics.median(wal), times_budget, pruned_budget))
            if args.explain:
                explain(engine, on)
            print(f"history {size:,}: sweep {statistics.median(times_on) * 1000:.0f} ms (retention off "
                  f"{statistics.median(times_off) * 1000:.0f} ms), pruned {pruned:,} in {args.sweeps} sweeps, "
                  f"WAL {statistics.median(wal) / 1e6:.1f} MB per sweep; with the default budget "
                  f"{statistics.median(times_budget) * 1000:.0f} ms, pruned {pruned_budget:,}", flush=True)
        engine.dispose()
        raw.close()
    finally:
        svc.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n{platform.node()} · {os.cpu_count()} CPUs · {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"command: python bench/retention_sweep.py --sizes {args.sizes} --sweeps {args.sweeps} --ids {args.ids}\n")
    print("| prunable history rows | sweep p50 / max ms, retention on, no budget | rows pruned per sweep"
          " | WAL per sweep MB | sweep p50 / max ms, default budget | rows pruned per sweep | retention off p50 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for _size, present, off_t, on_t, pruned, wal_p50, bud_t, pruned_b in rows:
        print(f"| {present:,} | {statistics.median(on_t) * 1000:.0f} / {max(on_t) * 1000:.0f} |"
              f" {pruned / len(on_t):,.0f} | {wal_p50 / 1e6:.1f} |"
              f" {statistics.median(bud_t) * 1000:.0f} / {max(bud_t) * 1000:.0f} | {pruned_b / len(bud_t):,.0f} |"
              f" {statistics.median(off_t) * 1000:.0f} |")


if __name__ == "__main__":
    main()
