#!/usr/bin/env python3
"""The orchestrator's own cost per job, without Celery: one thread, deterministic providers.

Ingests N images, then drains the hints in this process through ``app.worker.run.handle_hint``
(exactly what a Celery task calls) until none is left. Prints jobs/s, this process's CPU per job,
and per lane the wall time, hints handled and SQL statements per job (counted with SQLAlchemy
events); ``--statements`` also lists every statement shape with its count and wall time per job.

    python bench/pipeline_inprocess.py [--n 600] [--statements | --no-count] [--agent-batch B] [--agent-lane-limit L]

Fresh embedded PostgreSQL (durable settings) under a temp dir unless --database-url (Redis is not used).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import event, text  # noqa: E402

from bench.common import bench_servers, ingest_pngs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--statements", action="store_true", help="list statement shapes by wall time")
    from app.config import Settings

    defaults = Settings()
    ap.add_argument("--agent-batch", type=int, default=defaults.agent_batch_size,
                    help="MEMEFLOW_AGENT_BATCH_SIZE (default: settings)")
    ap.add_argument("--agent-lane-limit", type=int, default=defaults.agent_lane_limit,
                    help="MEMEFLOW_AGENT_LANE_LIMIT (default: settings; 0 = none)")
    ap.add_argument("--database-url")
    ap.add_argument("--no-count", action="store_true",
                    help="count no statements: the CPU figure then includes the store's fast path")
    args = ap.parse_args()

    from app.db.engine import make_engine
    from app.orchestrator import Orchestrator, RecordingPublisher
    from app.stages.providers import Providers
    from app.worker.run import handle_hint

    with bench_servers("memeflow-inproc-", args.database_url, "redis://unused") as (tmp, db_url, _):
        settings = Settings(database_url=db_url, broker_url="redis://unused", var_dir=tmp / "run",
                            visual_provider="deterministic", agent_provider="deterministic",
                            text_provider="deterministic", log_level="WARNING", agent_batch_size=args.agent_batch,
                            agent_lane_limit=args.agent_lane_limit)
        engine = make_engine(db_url, pre_ping=False)
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE scopes CASCADE"))
        orch = Orchestrator(engine, settings)
        pub = RecordingPublisher()
        ingest_pngs(orch, settings, orch.ensure_scope("local"), args.n, int(time.time()), pub)

        lane_now = ["-"]
        counts: collections.Counter = collections.Counter()
        walls: collections.Counter = collections.Counter()
        started: dict[int, float] = {}

        def shape(statement: str) -> tuple[str, str]:
            return lane_now[0], " ".join(statement.split())[:100]

        def _before(conn, cursor, statement, *a):
            counts[shape(statement)] += 1
            started[id(cursor)] = time.perf_counter()

        def _after(conn, cursor, statement, *a):
            walls[shape(statement)] += time.perf_counter() - started.pop(id(cursor), time.perf_counter())

        if not args.no_count:  # listeners send every statement through SQLAlchemy's own path (app/db/fastpath.py)
            event.listen(engine, "before_cursor_execute", _before)
            event.listen(engine, "after_cursor_execute", _after)

        providers = Providers(settings)
        lane_wall: collections.Counter = collections.Counter()
        lane_hints: collections.Counter = collections.Counter()
        t0, c0 = time.perf_counter(), time.process_time()
        while (hint := pub.take(0)) is not None:
            lane_now[0] = hint.lane
            t = time.perf_counter()
            handle_hint(orch, hint.lane, hint.task_id, "bench", providers, pub)
            lane_wall[hint.lane] += time.perf_counter() - t
            lane_hints[hint.lane] += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        with engine.connect() as conn:
            done = conn.execute(text("SELECT count(*) FROM processing_jobs WHERE status = 'succeeded'")).scalar_one()
        n = args.n
        print(f"{done}/{n} jobs succeeded: {n / wall:.0f} jobs/s, wall {wall:.2f} s, this process's CPU "
              f"{1000 * cpu / n:.2f} ms/job")
        print("| lane | wall ms/job | hints | statements/job |")
        print("|---|---|---|---|")
        for lane in ("visual", "agent", "embedding"):
            stmts = sum(c for (ln, _), c in counts.items() if ln == lane)
            print(f"| {lane} | {1000 * lane_wall[lane] / n:.2f} | {lane_hints[lane]} | {stmts / n:.1f} |")
        if args.statements:
            print()
            for key in sorted(counts, key=lambda k: -walls[k]):
                print(f"{counts[key] / n:5.2f}/job {1000 * walls[key] / n:6.2f} ms/job  {key[0]:9} {key[1]}")
        engine.dispose()

if __name__ == "__main__":
    main()
