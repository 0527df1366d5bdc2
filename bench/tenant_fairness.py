#!/usr/bin/env python3
"""Tenants sharing one API process (gunicorn, 1 worker × 16 threads, token auth, embedded services).

1. **Streams**: scopes s0 and s1 open 4 SSE streams each (the process's 8); then s2 opens one.
   Per trial: s2's status and the time to its response headers, and the time until one of the
   eight ends (a fair share for s2). Before this branch: 429 for as long as they hold them.
2. **Search storm**: for ``--seconds``, s0 runs ``--greedy`` concurrent search loops, s1–s3 one
   loop each, while s4 reads its image list in a loop: per scope the searches answered (200) and
   refused (429), and s4's read latency (p50/p99).

    PYTHONPATH=. python bench/tenant_fairness.py [--trials 10] [--seconds 20] [--greedy 12]

Measures the checkout it is run from: run it from that checkout's root, with it on PYTHONPATH
(``python -m gunicorn`` imports ``app`` from the working directory); to compare with another
checkout, copy this file into it and run it there with ``FAIRNESS_ROOT`` set to its root.
"""

from __future__ import annotations

import argparse
import http.client
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(os.environ.get("FAIRNESS_ROOT", Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(ROOT))


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else float("nan")


class Sse:
    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        t0 = time.perf_counter()
        self.conn.request("GET", "/api/v1/events", headers={"Authorization": f"Bearer {token}",
                                                            "Accept": "text/event-stream"})
        self.resp = self.conn.getresponse()
        self.header_s = time.perf_counter() - t0
        self.status = self.resp.status
        self.ended_at: float | None = None
        if self.status == 200:
            threading.Thread(target=self._drain, daemon=True).start()
        else:
            self.resp.read()

    def _drain(self) -> None:
        try:
            while self.resp.readline():
                pass
        except (OSError, ValueError, AttributeError):  # closed by this bench: not an end of the stream
            return
        self.ended_at = time.perf_counter()

    def close(self) -> None:
        self.resp.close()
        self.conn.close()


def streams(port: int, tokens: list[str], engine, trials: int) -> None:
    from sqlalchemy import text

    for trial in range(trials):
        held = [Sse(port, tokens[0]) for _ in range(4)] + [Sse(port, tokens[1]) for _ in range(4)]
        assert all(s.status == 200 for s in held), [s.status for s in held]
        t0 = time.perf_counter()
        newcomer = Sse(port, tokens[2])
        ended = None
        while newcomer.status == 200 and time.perf_counter() - t0 < 30:
            ended = [s for s in held if s.ended_at is not None]
            if ended:
                break
            time.sleep(0.005)
        end_s = (min(s.ended_at for s in ended) - t0) if ended else None
        print(f"  trial {trial + 1}: s2 -> {newcomer.status} in {1000 * newcomer.header_s:.1f} ms; "
              + (f"one of s0/s1's streams ended {1000 * end_s:.1f} ms after s2 asked" if end_s is not None
                 else "none of s0/s1's streams ended"), flush=True)
        for s in [*held, newcomer]:
            s.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # every stream noticed its closed client (a heartbeat write)
            with engine.connect() as conn:
                if conn.execute(text("SELECT count(*) FROM event_stream_slots")).scalar_one() == 0:
                    break
            time.sleep(0.1)


def storm(port: int, tokens: list[str], seconds: float, greedy: int) -> None:
    counts: dict[str, dict[int, int]] = {}
    reads: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def search_loop(name: str, token: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < stop:
            conn.request("GET", "/api/v1/search/text?q=cat+meme&limit=20", headers={"Authorization": f"Bearer {token}"})
            resp = conn.getresponse()
            resp.read()
            with lock:
                counts.setdefault(name, {}).setdefault(resp.status, 0)
                counts[name][resp.status] += 1
            if resp.status == 429:
                time.sleep(0.05)  # a client that retries soon (Retry-After says 1 s)
        conn.close()

    def read_loop(token: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            conn.request("GET", "/api/v1/images?limit=20", headers={"Authorization": f"Bearer {token}"})
            resp = conn.getresponse()
            resp.read()
            with lock:
                reads.append(time.perf_counter() - t0)
            time.sleep(0.02)
        conn.close()

    threads = [threading.Thread(target=search_loop, args=("s0", tokens[0])) for _ in range(greedy)]
    threads += [threading.Thread(target=search_loop, args=(f"s{i}", tokens[i])) for i in (1, 2, 3)]
    threads.append(threading.Thread(target=read_loop, args=(tokens[4],)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in sorted(counts):
        c = counts[name]
        print(f"  {name}: {c.get(200, 0)} answered, {c.get(429, 0)} refused (429)"
              + (f", other {dict((k, v) for k, v in c.items() if k not in (200, 429))}" if set(c) - {200, 429} else ""))
    print(f"  s4 reads: {len(reads)}, p50 {1000 * pct(reads, 0.5):.1f} ms, p99 {1000 * pct(reads, 0.99):.1f} ms",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--greedy", type=int, default=12)
    args = ap.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, code {ROOT}", flush=True)

    from app.auth import create_scope, create_token
    from app.cli import processes
    from app.cli import stack as stack_mod
    from app.cli.stack import Stack
    from app.config import Settings, reset_settings
    from app.db.engine import make_engine
    from bench.real_pipeline import _free_port

    stack_mod.api_cmd = lambda host, port: processes.api_cmd(host, port, workers=1)  # one process: one pool
    tmp = Path(tempfile.mkdtemp(prefix="memeflow-fair-"))
    os.environ.update(MEMEFLOW_VAR_DIR=str(tmp / "var"), MEMEFLOW_API_PORT=str(_free_port()), MEMEFLOW_AUTH="token",
                      MEMEFLOW_LOG_LEVEL="WARNING", MEMEFLOW_TEXT_PROVIDER="deterministic",
                      MEMEFLOW_EVENT_HEARTBEAT_S="1",  # a closed bench connection is found within seconds
                      MEMEFLOW_VISUAL_PROVIDER="deterministic", MEMEFLOW_AGENT_PROVIDER="deterministic")
    reset_settings()
    settings = Settings.from_env()
    stack = Stack(settings, components=("api",), echo=lambda *a, **k: None, start_timeout_s=120)
    engine = None
    try:
        stack.start()
        engine = make_engine(stack.database_url, pre_ping=False)
        tokens = []
        for i in range(5):
            create_scope(engine, f"s{i}")
            tokens.append(create_token(engine, f"s{i}", "bench")[1])
        print("streams: s0 and s1 hold 4 SSE streams each (8 per process); s2 opens one", flush=True)
        streams(settings.api_port, tokens, engine, args.trials)
        print(f"search storm, {args.seconds:.0f} s: s0 {args.greedy} loops, s1-s3 one each; s4 reads", flush=True)
        storm(settings.api_port, tokens, args.seconds, args.greedy)
    finally:
        if engine is not None:
            engine.dispose()
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
