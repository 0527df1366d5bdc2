#!/usr/bin/env python3
"""memeflow pipeline throughput with no-op (deterministic) providers, publish-then-drain.

Method, as in ../shared/bench/peers (so the numbers compare): with no worker running, ingest N
images (one transaction each: image + job + first task) and publish their visual hints to Redis;
then start W ``celery worker -P solo`` processes and time from the first task completion to the
last job completion (process start-up excluded). Prints jobs/s, PostgreSQL commits per job
(``xact_commit`` delta of the database over the drain, minus this script's own polling, divided
by N; the ingest transactions are reported separately) and p50/p99 time-in-stage (task
``started_at`` → ``completed_at``) plus queue-to-done per stage.

    python bench/pipeline_throughput.py [--n 2000] [--workers 2] [--layout shared|per-lane] [--runs 1]
        [--agent-lane-limit L] [--agent-batch B]

``--layout shared`` (default): each worker consumes all three queues, like the peers' 2 solo
nodes. ``per-lane``: one worker per lane (W is then 3). Servers: fresh embedded PostgreSQL
(synchronous_commit on, fsync on) and Redis under a temp dir, unless --database-url/--broker-url.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import text

from bench.common import bench_servers, create_pg_stat_statements, ingest_pngs, preload_pg_stat_statements

LANES = ("visual", "agent", "embedding")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def xact_commit(engine) -> int:
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_force_next_flush()"))
        conn.commit()
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")).scalar_one())


def one_run(args, db_url: str, broker_url: str, var_dir: Path) -> dict:
    import redis

    from app.config import Settings
    from app.db.engine import make_engine
    from app.orchestrator import Orchestrator
    from app.publisher import CeleryHintPublisher, celery_app_for

    settings = Settings(
        database_url=db_url, broker_url=broker_url, var_dir=var_dir, visual_provider="deterministic",
        agent_provider="deterministic", text_provider="deterministic", log_json=True, log_level="WARNING",
        lease_s=60, heartbeat_s=20, sweep_interval_s=15, rehint_grace_s=30,
        embedding_batch_size=args.embedding_batch, visual_batch_size=args.visual_batch,
    )
    engine = make_engine(db_url, pre_ping=False)  # pool pings would count as commits
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE scopes CASCADE"))
    redis.Redis.from_url(broker_url).flushdb()
    orch = Orchestrator(engine, settings)
    app = celery_app_for(broker_url, "bench")
    publisher = CeleryHintPublisher(app)

    namespace = orch.ensure_scope("local")
    c0 = xact_commit(engine)
    t0 = time.perf_counter()
    ingest_pngs(orch, settings, namespace, args.n, int(time.time()), publisher)
    publish_s = time.perf_counter() - t0
    if args.pg_stat_statements:  # the drain's statements only
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_stat_statements_reset()"))
    c1 = xact_commit(engine)

    env = dict(os.environ)
    env.update(
        MEMEFLOW_DATABASE_URL=db_url, MEMEFLOW_BROKER_URL=broker_url, MEMEFLOW_VAR_DIR=str(var_dir),
        MEMEFLOW_VISUAL_PROVIDER="deterministic", MEMEFLOW_AGENT_PROVIDER="deterministic",
        MEMEFLOW_TEXT_PROVIDER="deterministic", MEMEFLOW_LOG_LEVEL="WARNING", MEMEFLOW_LEASE_S="60",
        MEMEFLOW_HEARTBEAT_S="20", MEMEFLOW_EMBEDDING_BATCH_SIZE=str(args.embedding_batch),
        MEMEFLOW_VISUAL_BATCH_SIZE=str(args.visual_batch), PYTHONPATH=str(ROOT),
    )
    if args.agent_batch is not None:
        env["MEMEFLOW_AGENT_BATCH_SIZE"] = str(args.agent_batch)
    if args.agent_lane_limit is not None:
        env["MEMEFLOW_AGENT_LANE_LIMIT"] = str(args.agent_lane_limit)
    from app.cli.processes import worker_cmd

    layouts = [list(LANES)] * args.workers if args.layout == "shared" else [[lane] for lane in LANES]
    procs = []
    for i, lanes in enumerate(layouts):
        cmd = worker_cmd(lanes, pool="solo", node=f"bench{i}@{socket.gethostname()}", loglevel="WARNING",
                         heartbeat=False)
        with open(var_dir / f"worker{i}.log", "ab") as log:
            procs.append(subprocess.Popen(cmd, env={**env, "MEMEFLOW_WORKER_LANES": ",".join(lanes)}, cwd=ROOT,
                                          stdout=subprocess.DEVNULL, stderr=log))
    spies = _start_profilers(args, procs) if args.profile else []
    pg = _postmaster(engine)
    polls = 0
    deadline = time.monotonic() + args.timeout
    cpu_mark: tuple[int, float] | None = None  # (jobs done, workers' CPU s) once the drain is under way
    try:
        while True:
            with engine.connect() as conn:
                done = conn.execute(text("SELECT count(*) FROM processing_jobs WHERE status = 'succeeded'")).scalar_one()
            polls += 1
            if done >= args.n:
                cpu_end = (done, _cpu_s(procs), _pg_cpu_s(pg))
                break
            if done and cpu_mark is None:
                cpu_mark = (done, _cpu_s(procs), _pg_cpu_s(pg))
            if time.monotonic() > deadline:
                raise SystemExit(f"timeout: {done}/{args.n} jobs succeeded")
            time.sleep(0.5)
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for spy in spies:
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    time.sleep(1.0)  # exiting backends flush their statistics
    c2 = xact_commit(engine)

    with engine.connect() as conn:
        first, last = conn.execute(text(
            "SELECT (SELECT min(completed_at) FROM tasks), (SELECT max(completed_at) FROM processing_jobs)")).one()
        rows = conn.execute(text(
            "SELECT lane, extract(epoch FROM completed_at - started_at), extract(epoch FROM completed_at - created_at)"
            " FROM tasks WHERE status = 'succeeded'")).all()
        attempts = conn.execute(text("SELECT max(attempt_count), count(*) FROM tasks")).one()
    if args.pg_stat_statements:
        _print_statements(engine, args.n)
    engine.dispose()
    drain_s = (last - first).total_seconds()
    run_s = {lane: [float(r[1]) for r in rows if r[0] == lane and r[1] is not None] for lane in LANES}
    e2e_s = {lane: [float(r[2]) for r in rows if r[0] == lane] for lane in LANES}
    cpu_mark = cpu_mark or (0, 0.0, 0.0)
    worker_cpu_ms = 1000 * (cpu_end[1] - cpu_mark[1]) / max(1, cpu_end[0] - cpu_mark[0])
    pg_cpu_ms = 1000 * (cpu_end[2] - cpu_mark[2]) / max(1, cpu_end[0] - cpu_mark[0]) if pg else float("nan")
    return {
        "worker_cpu_ms_per_job": worker_cpu_ms, "pg_cpu_ms_per_job": pg_cpu_ms,
        "n": args.n, "workers": len(layouts), "layout": args.layout, "publish_s": publish_s,
        "publish_jobs_per_s": args.n / publish_s, "drain_s": drain_s, "jobs_per_s": args.n / drain_s,
        "ingest_commits_per_job": (c1 - c0 - 1) / args.n,
        "drain_commits_per_job": (c2 - c1 - polls - 1) / args.n,
        "tasks": attempts[1], "max_attempt_count": attempts[0],
        "run_ms": {lane: {"p50": 1000 * pct(v, 0.5), "p99": 1000 * pct(v, 0.99)} for lane, v in run_s.items()},
        "queued_to_done_ms": {lane: {"p50": 1000 * pct(v, 0.5), "p99": 1000 * pct(v, 0.99)}
                              for lane, v in e2e_s.items()},
    }


def _cpu_s(procs: list) -> float:
    """User + system CPU seconds of the worker processes (and their children) so far."""
    import psutil

    total = 0.0
    for p in procs:
        try:
            proc = psutil.Process(p.pid)
            for q in [proc, *proc.children(recursive=True)]:
                t = q.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _print_statements(engine, n: int) -> None:
    """The drain's statements by server time (exec + plan) per job, from pg_stat_statements."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT calls, plans, total_exec_time, total_plan_time, regexp_replace(query, '\\s+', ' ', 'g')"
            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " ORDER BY total_exec_time + total_plan_time DESC")).all()
    total = sum(r[2] + r[3] for r in rows)
    print(f"server time {total / n:.2f} ms/job in {sum(r[0] for r in rows) / n:.2f} statements/job"
          f" (exec + plan ms/job, calls, plans):")
    for calls, plans, exec_ms, plan_ms, query in rows[:25]:
        print(f"  {exec_ms / n:6.3f} + {plan_ms / n:5.3f}  {calls:6d} {plans:6d}  {query[:110]}")


def _postmaster(engine):
    """The PostgreSQL postmaster (psutil.Process) when it runs on this machine, else None."""
    import psutil

    try:
        with engine.connect() as conn:
            data_dir = conn.execute(text("SELECT current_setting('data_directory')")).scalar_one()
        pid = int((Path(data_dir) / "postmaster.pid").read_text().split()[0])
        return psutil.Process(pid)
    except Exception:  # noqa: BLE001 - a remote or unreadable server: no PostgreSQL CPU figure
        return None


def _pg_cpu_s(pg) -> float:
    """User + system CPU seconds of PostgreSQL so far: the postmaster, its live backends and
    auxiliary processes, and the exited ones it reaped (its ``children_*`` times)."""
    import psutil

    if pg is None:
        return 0.0
    t = pg.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for q in pg.children():
        try:
            c = q.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


def _start_profilers(args, procs: list) -> list:
    """``py-spy record`` (on PATH) attached to every worker, raw collapsed stacks per worker."""
    import shutil

    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy on PATH")
    args.profile.mkdir(parents=True, exist_ok=True)
    spies = []
    for i, p in enumerate(procs):
        out = args.profile / f"worker{i}-{int(time.time())}.txt"
        cmd = [spy, "record", "-p", str(p.pid), "-r", "200", "--format", "raw", "-o", str(out), "--threads"]
        if args.profile_idle:
            cmd.append("--idle")
        if args.profile_gil:
            cmd.append("--gil")
        spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return spies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--layout", choices=["shared", "per-lane"], default="shared")
    ap.add_argument("--runs", type=int, default=1)
    from app.config import Settings

    defaults = Settings()
    ap.add_argument("--embedding-batch", type=int, default=defaults.embedding_batch_size,
                    help="MEMEFLOW_EMBEDDING_BATCH_SIZE (default: settings)")
    ap.add_argument("--visual-batch", type=int, default=defaults.visual_batch_size,
                    help="MEMEFLOW_VISUAL_BATCH_SIZE for uploads and workers (default: settings)")
    ap.add_argument("--agent-batch", type=int, help="MEMEFLOW_AGENT_BATCH_SIZE for the workers (default: settings)")
    ap.add_argument("--agent-lane-limit", type=int,
                    help="MEMEFLOW_AGENT_LANE_LIMIT for the workers (default: settings; 0 = no limit)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--database-url")
    ap.add_argument("--broker-url")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--pg-stat-statements", action="store_true",
                    help="print the drain's statements by server time (the embedded cluster loads "
                         "pg_stat_statements; a --database-url server must load it itself)")
    ap.add_argument("--profile", type=Path, help="py-spy (on PATH) every worker during the drain, raw stacks here")
    ap.add_argument("--profile-idle", action="store_true", help="with --profile: also sample idle threads")
    ap.add_argument("--profile-gil", action="store_true", help="with --profile: only samples holding the GIL")
    args = ap.parse_args()
    if args.pg_stat_statements and not args.database_url:  # the embedded cluster is fresh: load it there
        preload_pg_stat_statements(planning=True)

    with bench_servers("memeflow-bench-", args.database_url, args.broker_url) as (tmp, db_url, broker_url):
        if args.pg_stat_statements:
            from app.db.engine import make_engine

            engine = make_engine(db_url, pre_ping=False)
            create_pg_stat_statements(engine)
            engine.dispose()
        results = []
        for run in range(args.runs):
            r = one_run(args, db_url, broker_url, tmp / f"run{run}")
            results.append(r)
            print(f"run {run + 1}: {r['jobs_per_s']:.0f} jobs/s  drain {r['drain_s']:.1f}s  "
                  f"commits/job drain {r['drain_commits_per_job']:.2f} (+ingest {r['ingest_commits_per_job']:.2f})  "
                  f"worker CPU {r['worker_cpu_ms_per_job']:.2f} ms/job  PG CPU {r['pg_cpu_ms_per_job']:.2f} ms/job  "
                  f"agent run p50 {r['run_ms']['agent']['p50']:.1f} ms",
                  flush=True)
        rates = [r["jobs_per_s"] for r in results]
        last = results[-1]
        print()
        print(f"| N | workers ({args.layout}, solo) | jobs/s min / median / max | commits/job (drain + ingest) |"
              " run p50/p99 ms visual · agent · embedding | queued→done p50/p99 ms visual · agent · embedding |")
        print("|---|---|---|---|---|---|")
        run_ms = " · ".join(f"{last['run_ms'][lane]['p50']:.1f}/{last['run_ms'][lane]['p99']:.1f}" for lane in LANES)
        q_ms = " · ".join(f"{last['queued_to_done_ms'][lane]['p50']:.0f}/{last['queued_to_done_ms'][lane]['p99']:.0f}"
                          for lane in LANES)
        print(f"| {args.n} | {last['workers']} | {min(rates):.0f} / **{statistics.median(rates):.0f}** / {max(rates):.0f}"
              f" | {last['drain_commits_per_job']:.2f} + {last['ingest_commits_per_job']:.2f} | {run_ms} | {q_ms} |")
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
