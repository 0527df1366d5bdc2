#!/usr/bin/env python3
"""Uploads accepted per second through the REST API, with 1 and 4 concurrent clients.

The API of ``memeflow up`` (gunicorn, its default 2 processes × threads, embedded PostgreSQL with
fsync on, Redis) and nothing else: no worker runs, so the uploads' hints wait in Redis and the
figures are the API's alone. Each client uploads distinct generated images (``--kind meme``:
~60 KiB 320–600 px PNG memes; ``photo``: 1920×1080 JPEG photos, ~0.5 MiB) and records each
request's latency; per concurrency level prints uploads/s and p50/p99 latency, and the CPU
seconds the API processes and PostgreSQL used per upload.

    PYTHONPATH=. python bench/ingest_api.py [--n 200] [--clients 1,4] [--kind meme|photo] [--rounds 1] [--pg-stats]

``--pg-stats``: pg_stat_statements in the embedded cluster (nested statements — FK checks,
triggers — included); per measurement, the statements per upload and the commits per upload.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.real_pipeline import _cpu, _free_port, _process_groups, memes  # noqa: E402


def photos(count: int, seed: int) -> list[bytes]:
    """``count`` distinct 1920×1080 JPEG "photos" (smooth noise, quality 90)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        small = rng.integers(0, 256, (27, 48, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((1920, 1080), Image.Resampling.BICUBIC)
        noise = rng.integers(0, 24, (1080, 1920, 3), dtype=np.uint8)
        img = Image.fromarray(np.asarray(img, dtype=np.uint8) ^ noise)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def run(base: str, images: list[bytes], clients: int, media: str) -> dict:
    import requests

    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    chunks = [images[i::clients] for i in range(clients)]
    barrier = threading.Barrier(clients + 1)

    def client(chunk: list[bytes]) -> None:
        session = requests.Session()
        barrier.wait()
        for i, data in enumerate(chunk):
            t0 = time.perf_counter()
            r = session.post(f"{base}/api/v1/images", files={"file": (f"f{i}", data, media)}, timeout=120)
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                if r.status_code != 201:
                    errors.append(f"{r.status_code} {r.text[:100]}")

    threads = [threading.Thread(target=client, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"clients": clients, "n": len(images), "wall_s": wall, "uploads_per_s": len(images) / wall,
            "p50_ms": 1000 * pct(latencies, 0.5), "p99_ms": 1000 * pct(latencies, 0.99), "errors": errors[:3],
            "n_errors": len(errors)}


def _reset_stats(engine) -> int:
    """Reset pg_stat_statements; the database's commits so far."""
    from sqlalchemy import text

    with engine.begin() as conn:
        conn.execute(text("SELECT pg_stat_statements_reset()"))
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        return conn.execute(text("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")).scalar()


def _print_stats(engine, n: int, commits0: int) -> float:
    """Print the statements per upload since ``_reset_stats``, most frequent first; their sum."""
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT calls, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 100) FROM pg_stat_statements"
            " WHERE query !~* 'pg_stat_statements|pg_stat_database|pg_stat_clear_snapshot' ORDER BY calls DESC, query")).all()
        commits = conn.execute(text(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")).scalar() - commits0
    total = sum(r[0] for r in rows)
    print(f"      {total / n:.1f} statements per upload (nested ones included), {commits / n:.2f} commits per upload:")
    for calls, ex, q in rows:
        if calls >= n / 10:
            print(f"        {calls / n:5.2f}  {ex / calls:6.3f} ms  {q}")
    return total / n


def _start_profile(directory: Path, procs: list) -> list:
    """py-spy record (on-CPU, every thread) of each API process into ``directory``."""
    import shutil
    import subprocess

    spy = shutil.which("py-spy")
    if not spy:
        print("# --profile: py-spy is not on PATH", flush=True)
        return []
    directory.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen([spy, "record", "--nonblocking", "--threads", "-r", "100", "-f", "raw", "-o",
                              str(directory / f"api-{p.pid}.txt"), "-p", str(p.pid)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in procs]


def _stop_profile(spies: list) -> None:
    import signal

    for sp in spies:
        sp.send_signal(signal.SIGINT)
    for sp in spies:
        try:
            sp.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a profiler that hangs must not keep the stack up
            sp.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="uploads per measurement")
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--kind", choices=["meme", "photo"], default="meme")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pg-stats", action="store_true", help="statements per upload (pg_stat_statements)")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    ap.add_argument("--profile", type=Path,
                    help="py-spy (on PATH) the API processes into this dir, on-CPU samples only (raw collapsed stacks)")
    args = ap.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, load average "
          f"{os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    total = args.n * len(levels) * args.rounds + 5
    images = memes(total, seed=500) if args.kind == "meme" else photos(total, seed=500)
    media = "image/png" if args.kind == "meme" else "image/jpeg"
    print(f"# {args.kind}: {sum(map(len, images)) / len(images) / 1024:.0f} KiB on average", flush=True)

    import shutil
    import tempfile

    from app.cli.stack import Stack
    from app.config import Settings, reset_settings

    tmp = Path(tempfile.mkdtemp(prefix="memeflow-ingest-"))
    os.environ.update(MEMEFLOW_VAR_DIR=str(tmp / "var"), MEMEFLOW_API_PORT=str(_free_port()),
                      MEMEFLOW_LOG_LEVEL="WARNING")
    reset_settings()
    settings = Settings.from_env()
    if args.pg_stats:  # a fresh cluster (the var dir is new) with pg_stat_statements loaded
        from bench.common import preload_pg_stat_statements

        preload_pg_stat_statements()
    stack = Stack(settings, components=("api",), echo=lambda *a, **k: None, start_timeout_s=120)
    engine = None
    results = []
    try:
        stack.start()
        base = f"http://127.0.0.1:{settings.api_port}"
        if args.pg_stats:
            from app.db.engine import make_engine
            from bench.common import create_pg_stat_statements

            engine = make_engine(stack.database_url, pre_ping=False)
            create_pg_stat_statements(engine)
        run(base, images[:5], 1, media)  # warm: connections, first requests
        cursor = 5
        groups = _process_groups(stack)
        spies = _start_profile(args.profile, groups.get("api", [])) if args.profile else []
        for r in range(args.rounds):
            for clients in levels:
                chunk = images[cursor:cursor + args.n]
                cursor += args.n
                if engine is not None:
                    commits0 = _reset_stats(engine)
                cpu0 = _cpu(groups)
                out = run(base, chunk, clients, media)
                cpu1 = _cpu(groups, cpu0)
                cpu = {name: sum(v - cpu0.get(name, {}).get(pid, 0.0) for pid, v in cpu1[name].items())
                       for name in cpu1}
                print(f"[{r + 1}] {clients} client(s): {out['uploads_per_s']:6.1f} uploads/s  p50 {out['p50_ms']:.1f} ms"
                      f"  p99 {out['p99_ms']:.1f} ms  CPU ms/upload: " + ", ".join(
                          f"{k} {1000 * v / len(chunk):.1f}" for k, v in sorted(cpu.items()))
                      + (f"  errors {out['n_errors']}: {out['errors']}" if out["n_errors"] else "")
                      + f"  (load {os.getloadavg()[0]:.1f})", flush=True)
                results.append({**out, "round": r + 1, "load": os.getloadavg()[0],
                                "cpu_ms_per_upload": {k: 1000 * v / len(chunk) for k, v in cpu.items()}})
                if engine is not None:
                    results[-1]["statements"] = _print_stats(engine, len(chunk), commits0)
        _stop_profile(spies)
        if args.json:
            import json

            args.json.write_text(json.dumps(results, indent=1))
    finally:
        if engine is not None:
            engine.dispose()
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
