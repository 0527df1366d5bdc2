"""Events (issue 20): latency from an event's commit to its webhook delivery and to an SSE client,
and webhook delivery throughput of one webhooks worker.

Runs on a fresh embedded PostgreSQL (fsync on) + Redis, one real ``celery worker -Q webhooks``
(threads x8, as ``memeflow up`` and docker-compose run it, its hint poller every
MEMEFLOW_WEBHOOK_POLL_S), a local HTTP receiver, and the API app served in-process (werkzeug,
threaded) for one SSE client.

1. latency: ``--events`` events committed one by one, ``--gap-ms`` apart (the outbox path every
   event takes: staged in the transaction, id drawn at commit); each one's commit time (when the
   commit returned) against its arrival at the receiver and at the SSE client → p50/p99/max.
2. throughput: ``--burst`` events per subscription committed at once (50 per transaction) for 1
   and for ``--subs`` subscriptions; deliveries/s from the first commit to the last arrival.

    python bench/events_latency.py [--events 300] [--gap-ms 20] [--burst 1000] [--subs 8]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import bench_servers  # noqa: E402


class Arrivals:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at: dict[tuple[str, int], float] = {}  # (receiver path, payload seq) -> arrival

    def add(self, path: str, seq: int) -> None:
        now = time.time()
        with self.lock:
            self.at.setdefault((path, seq), now)

    def count(self, prefix: str) -> int:
        with self.lock:
            return sum(1 for p, _ in self.at if p.startswith(prefix))


def receiver(arrivals: Arrivals) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            arrivals.add(self.path, body["payload"]["seq"])
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def sse_client(url: str, arrivals: Arrivals, stop: threading.Event) -> None:
    import requests

    with requests.get(url, headers={"Accept": "text/event-stream"}, stream=True, timeout=60) as resp:
        for line in resp.iter_lines(decode_unicode=True):
            if stop.is_set():
                return
            if line and line.startswith("data: "):
                arrivals.add("sse", json.loads(line[6:])["payload"]["seq"])


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=300)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--subs", type=int, default=8)
    args = ap.parse_args()

    from werkzeug.serving import make_server

    from app.api import create_app
    from app.auth import LocalScopeResolver
    from app.cli.processes import settings_env, worker_cmd
    from app.config import Settings
    from app.db.engine import make_engine
    from app.orchestrator import Orchestrator, RecordingPublisher
    from app.orchestrator.store import events as events_q
    from app.storage import FileStore

    with bench_servers("mf-bench-events-") as (tmp, db_url, broker_url):
        settings = Settings(database_url=db_url, broker_url=broker_url, var_dir=tmp / "var",
                            webhook_allowed_networks="127.0.0.0/8", log_json=False, log_level="INFO")
        engine = make_engine(db_url, pool_size=8, max_overflow=8)
        orch = Orchestrator(engine, settings)
        orch.ensure_scope("local")
        arrivals = Arrivals()
        recv = receiver(arrivals)
        base = f"http://127.0.0.1:{recv.server_address[1]}"

        env = dict(os.environ, **settings_env(settings), PYTHONPATH=str(ROOT), MEMEFLOW_WORKER_MAINTENANCE="1")
        log_path = tmp / "webhooks-worker.log"
        with open(log_path, "ab") as log:
            worker = subprocess.Popen(
                worker_cmd(["webhooks"], pool="threads", concurrency=8, node=f"bench-webhooks@{socket.gethostname()}",
                           loglevel="INFO", heartbeat=False),
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        app = create_app(scope_resolver=LocalScopeResolver(), settings=settings, orchestrator=orch, engine=engine,
                         publisher=RecordingPublisher(), store=FileStore(settings.storage_path),
                         cursor_secret_key="bench-secret-0123456789")
        api = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=api.serve_forever, daemon=True).start()
        stop = threading.Event()
        try:
            deadline = time.time() + 90
            while b" ready." not in log_path.read_bytes():
                if worker.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"webhooks worker did not start:\n{log_path.read_text()[-2000:]}")
                time.sleep(0.2)
            hook, _ = orch.create_webhook("local", f"{base}/lat")
            after = orch.last_event_id("local")
            sse = threading.Thread(target=sse_client, args=(
                f"http://127.0.0.1:{api.server_port}/api/v1/events?after={after}", arrivals, stop), daemon=True)
            sse.start()
            time.sleep(1.0)

            # 1. latency
            committed: dict[int, float] = {}
            for i in range(args.events):
                with engine.begin() as c:
                    events_q.stage_event_txn(c, "local", "batch.progress", {"seq": i})
                committed[i] = time.time()
                time.sleep(args.gap_ms / 1000)
            deadline = time.time() + 60
            while (arrivals.count("/lat") < args.events or arrivals.count("sse") < args.events) and time.time() < deadline:
                time.sleep(0.1)
            rows = []
            for name, key in (("commit → webhook delivered", "/lat"), ("commit → SSE client", "sse")):
                lat = [(arrivals.at[(key, i)] - committed[i]) * 1000 for i in range(args.events) if (key, i) in arrivals.at]
                rows.append((name, len(lat), statistics.median(lat), pct(lat, 99), max(lat)))
            orch.delete_webhook("local", hook["id"])
            stop.set()

            # 2. throughput
            tput = []
            for subs in (1, args.subs):
                hooks = [orch.create_webhook("local", f"{base}/t{subs}-{k}")[0] for k in range(subs)]
                seq0 = 10_000_000 * subs
                t0 = time.time()
                for start in range(0, args.burst, 50):
                    with engine.begin() as c:
                        for i in range(start, min(args.burst, start + 50)):
                            events_q.stage_event_txn(c, "local", "batch.progress", {"seq": seq0 + i})
                want = subs * args.burst
                deadline = time.time() + 600
                while arrivals.count(f"/t{subs}-") < want and time.time() < deadline:
                    time.sleep(0.05)
                with arrivals.lock:
                    last = max(t for (p, _), t in arrivals.at.items() if p.startswith(f"/t{subs}-"))
                    got = sum(1 for p, _ in arrivals.at if p.startswith(f"/t{subs}-"))
                tput.append((subs, got, last - t0, got / (last - t0)))
                for h in hooks:
                    orch.delete_webhook("local", h["id"])
        finally:
            stop.set()
            worker.terminate()
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
            api.shutdown()
            recv.shutdown()
            engine.dispose()

    print(f"\n{args.events} events, one every {args.gap_ms:g} ms; webhook poll {settings.webhook_poll_s:g} s, "
          f"SSE poll {settings.event_poll_s:g} s\n")
    print("| path | n | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|")
    for name, n, p50, p99, mx in rows:
        print(f"| {name} | {n} | {p50:.0f} | {p99:.0f} | {mx:.0f} |")
    print(f"\none webhooks worker (threads x8), {args.burst} events per subscription committed at once\n")
    print("| subscriptions | delivered | seconds | deliveries/s |\n|---:|---:|---:|---:|")
    for subs, got, secs, rate in tput:
        print(f"| {subs} | {got} | {secs:.1f} | {rate:.0f} |")


if __name__ == "__main__":
    main()
