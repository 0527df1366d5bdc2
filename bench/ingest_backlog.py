"""Upload cost against the queued backlog, in a fresh database (docs/performance-log.md §44).

Ingests ``--n`` new images in steps of ``--step`` through ``Orchestrator.ingest_image`` (what
``POST /images`` runs: one transaction for the image, its job and its first task, then the hint),
into a fresh embedded PostgreSQL (fsync on) and Redis with no worker running, so every job stays
queued. After each step it prints the wall time per upload and the time per upload spent in each
of the store's statements on the fast path (``app.db.fastpath``). With ``--analyze-at K`` it runs
``ANALYZE`` once K uploads are in: the difference shows what the plans cached while the tables
were tiny cost until autovacuum's first analysis.

    PYTHONPATH=. python bench/ingest_backlog.py [--n 6000] [--step 1000] [--analyze-at 4000 | --sweep] [--top 6]
"""

from __future__ import annotations

import argparse
import collections
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text  # noqa: E402

from app.db import fastpath  # noqa: E402
from bench.common import bench_servers, ingest_pngs  # noqa: E402

_stats: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])


def _timed(original):
    def run(self, clause, params):
        t0 = time.perf_counter()
        try:
            return original(self, clause, params)
        finally:
            s = _stats[" ".join(clause.text.split())[:80]]
            s[0] += 1
            s[1] += time.perf_counter() - t0
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=6000)
    ap.add_argument("--step", type=int, default=1000)
    ap.add_argument("--analyze-at", type=int, default=0, help="ANALYZE once this many uploads are in (0: never)")
    ap.add_argument("--sweep", action="store_true",
                    help="run the reconcile sweep after each step, as beat does every 15 s (its statistics step included)")
    ap.add_argument("--top", type=int, default=6, help="statements listed per step")
    args = ap.parse_args()

    # timed inside the fast path (an engine event listener would switch the fast path off)
    fastpath.FastConnection._fast_execute = _timed(fastpath.FastConnection._fast_execute)
    print(f"# {platform.machine()}, python {platform.python_version()}, "
          f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; uploads with no worker running")
    with bench_servers("memeflow-ingest-backlog-") as (tmp, db_url, broker_url):
        from app.config import Settings
        from app.db.engine import make_engine
        from app.orchestrator import Orchestrator
        from app.publisher import CeleryHintPublisher, celery_app_for

        settings = Settings(database_url=db_url, broker_url=broker_url, var_dir=tmp / "var-app",
                            visual_provider="deterministic", agent_provider="deterministic",
                            text_provider="deterministic", log_level="WARNING")
        engine = make_engine(db_url, pre_ping=False)
        orch = Orchestrator(engine, settings)
        publisher = CeleryHintPublisher(celery_app_for(broker_url, "bench"))
        namespace = orch.ensure_scope("local")
        salt = int(time.time())
        done = 0
        while done < args.n:
            _stats.clear()
            t0 = time.perf_counter()
            ingest_pngs(orch, settings, namespace, args.step, salt + done * 7, publisher)
            wall = time.perf_counter() - t0
            done += args.step
            in_statements = sum(v[1] for v in _stats.values())
            print(f"{done:7d} queued: {1000 * wall / args.step:5.2f} ms per upload (wall), "
                  f"{1000 * in_statements / args.step:5.2f} in the store's statements")
            for stmt, (calls, secs) in sorted(_stats.items(), key=lambda kv: -kv[1][1])[:args.top]:
                print(f"      {1000 * secs / args.step:6.3f} ms  x{calls / args.step:.1f}  {stmt}")
            if args.sweep:
                t0 = time.perf_counter()
                counts = orch.sweep().counts
                print(f"  -- sweep: {1000 * (time.perf_counter() - t0):.0f} ms, tables analyzed "
                      f"{counts.get('tables_analyzed')}, deferred {counts.get('tables_analyze_deferred')}")
            if args.analyze_at and done == args.analyze_at:
                with engine.begin() as conn:
                    conn.execute(text("ANALYZE"))
                print("  -- ANALYZE --")
        engine.dispose()


if __name__ == "__main__":
    main()
