#!/usr/bin/env python3
"""Real providers: a bare loop against the pipeline in the default ``memeflow up`` topology.

Both sides in one run, on the same generated memes (rendered captions over a busy picture,
320–600 px, PNG; ``bench/ocr_memes.py``'s styles with a fresh seed per set):

- **bare loop**: decode → visual → agent (OCR) → text embedding, one image at a time, models
  loaded once per process, no database, no broker. Run in 1..N processes (N = cores, by default),
  each taking every N-th image; the best rate is "what the box can do with these providers".
- **pipeline**: :class:`app.cli.stack.Stack` with its default components (API, one worker
  per lane, beat, Flower; embedded PostgreSQL with fsync on and Redis) and the default settings
  (``--env K=V`` overrides, for A/B). ``--warmup`` images are uploaded and processed first
  (models warm), then ``--n`` images are uploaded through the API by one client, and the time runs
  from the first upload until every job is terminal.

Prints images/s for both, the ratio, per-lane busy time (the union of the lane's task
``started_at → completed_at`` intervals, so a batch counts once) and the CPU seconds each
process used during the measured window.

    PYTHONPATH=. python bench/real_pipeline.py [--n 80] [--warmup 10] [--rounds R] [--procs 1,2] [--env MEMEFLOW_X=Y ...]
        [--skip-bare] [--skip-pipeline] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import multiprocessing as mp
import os
import platform
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

LANES = ("visual", "agent", "embedding")
TERMINAL = ("succeeded", "failed", "blocked", "unknown_execution", "target_changed", "superseded", "cancelled")


def memes(count: int, seed: int) -> list[bytes]:
    """``count`` distinct PNG memes (``bench/ocr_memes.styled`` sets, one seed after another)."""
    from bench.ocr_memes import styled

    out: list[bytes] = []
    s = seed
    while len(out) < count:
        for meme in styled(seed=s):
            buf = io.BytesIO()
            meme.image.save(buf, format="PNG")
            out.append(buf.getvalue())
            if len(out) == count:
                break
        s += 1
    return out


# ---------------------------------------------------------------------------- busy cores
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BAR = " .:-=+*#%@"  # a bucket's busy share of the cores, 0 .. 100 %


def _box_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every core since boot (/proc/stat; idle and iowait are idle)."""
    with open("/proc/stat", "rb") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    total = sum(fields[:8])  # guest time is already inside user
    return total - fields[3] - fields[4], total


def _proc_ticks(pid: int) -> int | None:
    """utime + stime clock ticks of one process (every thread), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
        return int(rest[11]) + int(rest[12])
    except (OSError, IndexError, ValueError):
        return None


class CoreSampler:
    """Busy cores of the box (``/proc/stat``, every ``period_s``) and of the measured processes
    (``pids()``, re-listed every ``relist_s``; their utime + stime, read every ``own_every``-th
    sample and spread over those samples), sampled in a thread. ``summary`` then reports a window:
    the mean busy cores, the idle core-seconds (cores x time - busy) in total and per phase, the
    dips (runs of samples with at least half a core idle, >= 100 ms) and a coarse timeline. The
    box's figures include every other process on it; the measured processes' figures are the cores
    they left idle, whoever used them.

    The sampler runs on the box it measures, so it reads little: one ``/proc/stat`` line per
    sample, the measured processes' ``stat`` files every 250 ms, their list every 2 s, at the
    lowest CPU priority. Reading ~30 processes' files every 50 ms and re-listing them every 0.5 s
    cost 0.35–0.38 CPU-s per 8 s pipeline round — 2 % of the box, taken from the pipeline it
    measured (docs/performance-log.md §43); ``cpu_s`` reports what it used."""

    def __init__(self, pids, period_s: float = 0.05, relist_s: float = 2.0, own_every: int = 5) -> None:
        import threading

        self.pids, self.period_s, self.relist_s, self.own_every = pids, period_s, relist_s, own_every
        self.cores = os.cpu_count() or 1
        self.samples: list[tuple[float, float, float]] = []  # (end time.time(), box busy cores, own busy cores)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="core-sampler", daemon=True)
        self.cpu_s = 0.0  # the sampler thread's own CPU (it runs on the box it measures)

    def __enter__(self) -> CoreSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import threading

        with contextlib.suppress(OSError, AttributeError):  # this thread only (Linux: a tid is a process id)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        pids, listed = list(self.pids()), time.monotonic()
        box0, t0 = _box_ticks(), time.time()
        own0, own_t0 = {pid: _proc_ticks(pid) for pid in pids}, t0
        pending: list[tuple[float, float]] = []  # (time, box busy) since the last read of the processes

        def flush(t_end: float) -> None:  # the processes' rate since the last read, spread over pending
            nonlocal pending, own0, own_t0
            own1 = {pid: _proc_ticks(pid) for pid in pids}
            own = sum(max(0, v - own0[pid]) for pid, v in own1.items()
                      if v is not None and own0.get(pid) is not None) / _TICK / max(t_end - own_t0, 1e-6)
            self.samples.extend((t, box, min(own, float(self.cores))) for t, box in pending)
            pending, own0, own_t0 = [], own1, t_end

        def sample() -> float:
            nonlocal box0, t0
            box1, t1 = _box_ticks(), time.time()
            if t1 > t0 and box1[1] > box0[1]:
                pending.append((t1, self.cores * (box1[0] - box0[0]) / (box1[1] - box0[1])))
                box0, t0 = box1, t1
            return t1

        while not self._stop.wait(self.period_s):
            t1 = sample()
            if len(pending) < self.own_every:
                continue
            flush(t1)
            if time.monotonic() - listed > self.relist_s:
                with contextlib.suppress(Exception):
                    pids = list(self.pids())
                    own0 = {**own0, **{pid: _proc_ticks(pid) for pid in pids if pid not in own0}}
                listed = time.monotonic()
        sample()  # up to the stop, however late this thread ran before it (it runs at the lowest priority)
        if pending:
            flush(pending[-1][0])
        self.cpu_s = time.thread_time()

    def summary(self, start: float, end: float, phases: list[tuple[str, float, float]],
                bucket_s: float = 0.5) -> dict:
        """The window ``start .. end`` (time.time()); ``phases`` (name, start, end) within it."""
        rows, prev = [], None  # (a, b, box, own): each sample's interval clipped to the window
        for t, box, own in self.samples:
            a = prev if prev is not None else t - self.period_s
            prev = t
            a, b = max(a, start), min(t, end)
            if b > a:
                rows.append((a, b, box, own))

        def stats(lo: float, hi: float) -> dict:
            cut = [(max(a, lo), min(b, hi), box, own) for a, b, box, own in rows if min(b, hi) > max(a, lo)]
            span = sum(b - a for a, b, _, _ in cut)
            if span <= 0:
                return {"s": 0.0, "box_busy": None, "own_busy": None, "box_idle_core_s": 0.0, "own_idle_core_s": 0.0}
            box_busy = sum((b - a) * box for a, b, box, _ in cut)
            own_busy = sum((b - a) * own for a, b, _, own in cut)
            return {"s": span, "box_busy": box_busy / span, "own_busy": own_busy / span,
                    "box_idle_core_s": self.cores * span - box_busy, "own_idle_core_s": self.cores * span - own_busy}

        def dips(col: int) -> tuple[int, float]:
            count, total, run = 0, 0.0, 0.0
            for row in [*rows, (end, end, float(self.cores), float(self.cores))]:
                if row[col] <= self.cores - 0.5:
                    run += row[1] - row[0]
                    continue
                if run >= 0.1:
                    count, total = count + 1, total + run
                run = 0.0
            return count, total

        def timeline(col: int) -> str:
            out = []
            for i in range(max(1, int((end - start) / bucket_s + 0.999))):
                lo, hi = start + i * bucket_s, min(end, start + (i + 1) * bucket_s)
                cut = [(min(b, hi) - max(a, lo), r[col]) for r in rows for a, b in [r[:2]] if min(b, hi) > max(a, lo)]
                span = sum(w for w, _ in cut)
                share = sum(w * v for w, v in cut) / span / self.cores if span > 0 else 0.0
                out.append(_BAR[min(len(_BAR) - 1, int(share * (len(_BAR) - 1) + 0.5))])
            return "".join(out)

        return {"cores": self.cores, "all": stats(start, end),
                "phases": {name: stats(lo, hi) for name, lo, hi in phases},
                "box_dips": dips(2), "own_dips": dips(3), "bucket_s": bucket_s,
                "box_timeline": timeline(2), "own_timeline": timeline(3)}


def print_cores(label: str, s: dict) -> None:
    """Two or three compact lines of :meth:`CoreSampler.summary`."""
    a = s["all"]
    if a["box_busy"] is None:
        print(f"      {label} busy cores: no samples", flush=True)
        return
    ph = "; ".join(f"{name} {p['s']:.2f}s: {p['own_idle_core_s']:.2f} ({p['box_idle_core_s']:.2f})"
                   for name, p in s["phases"].items())
    print(f"      {label} busy cores of {s['cores']} over {a['s']:.2f}s: measured processes {a['own_busy']:.2f},"
          f" box {a['box_busy']:.2f}; idle core-s {a['own_idle_core_s']:.2f} (box {a['box_idle_core_s']:.2f});"
          f" by phase, idle core-s (box): {ph}; dips >= 0.5 core idle, >= 100 ms: {s['own_dips'][0]} of"
          f" {s['own_dips'][1]:.2f}s (box {s['box_dips'][0]} of {s['box_dips'][1]:.2f}s)", flush=True)
    print(f"      {label} timeline, busy share per {s['bucket_s']}s '{_BAR}': measured |{s['own_timeline']}|", flush=True)
    print(f"      {label} timeline, busy share per {s['bucket_s']}s '{_BAR}': box      |{s['box_timeline']}|", flush=True)


# ---------------------------------------------------------------------------- bare loop
def _bare_worker(images: list[bytes], results_dir: str, threads: int, ready, go, out) -> None:
    from app.config import Settings
    from app.orchestrator.fingerprints import semantic_document
    from app.stages.images import decode_image
    from app.stages.providers import Providers

    settings = Settings(var_dir=Path(results_dir), local_threads=threads)
    providers = Providers(settings)
    visual, agent, text = providers.visual, providers.agent, providers.text
    version = settings.text_document_version

    steps: dict[str, float] = {}  # CPU seconds of this (calling) thread per step

    def step(name: str, fn, *a, **k):
        c0 = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            steps[name] = steps.get(name, 0.0) + time.thread_time() - c0

    def one(data: bytes) -> None:
        img = step("decode", decode_image, data, max_pixels=settings.max_image_pixels)
        step("visual", visual.embed, [img])
        result = step("agent (OCR, facts, record)", agent.describe, img, attempt_id=uuid.uuid4().hex,
                      reverse_image_policy="forbid")
        doc = semantic_document(None, result.context, version)
        for part in getattr(text, "parts", None) or [text]:  # each model of a concatenated provider
            step(f"text {part.config()['model']}", part.embed, [doc])

    one(images[0])  # models loaded and warm
    steps.clear()
    ready.put(os.getpid())
    go.wait()
    import psutil

    cpu0, t0 = psutil.Process().cpu_times(), time.perf_counter()
    for data in images:
        one(data)
    cpu1 = psutil.Process().cpu_times()
    out.put((time.perf_counter() - t0, (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
             {k: v / len(images) for k, v in steps.items()}, time.time()))


def bare_loop(images: list[bytes], procs: int, threads: int) -> dict:
    """images/s of the bare loop in ``procs`` processes (spawned: nothing inherited), each model
    call with ``threads`` intra-op threads."""
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    with tempfile.TemporaryDirectory(prefix="memeflow-bare-") as tmp:
        workers = [ctx.Process(target=_bare_worker, args=(images[i::procs], tmp, threads, ready, go, out))
                   for i in range(procs)]
        for w in workers:
            w.start()
        for _ in workers:
            ready.get(timeout=300)
        with CoreSampler(lambda: [w.pid for w in workers]) as sampler:
            t0, start = time.perf_counter(), time.time()
            go.set()
            results = [out.get(timeout=1800) for _ in workers]
            wall = time.perf_counter() - t0
        for w in workers:
            w.join()
    ends = sorted(r[3] for r in results)
    cores = sampler.summary(start, ends[-1], [("all running", start, ends[0]), ("tail", ends[0], ends[-1])])
    steps = {k: 1000 * sum(r[2].get(k, 0.0) for r in results) / len(results) for k in results[0][2]}
    return {"procs": procs, "threads": threads, "wall_s": wall, "images_per_s": len(images) / wall,
            "cpu_s": [round(r[1], 2) for r in results], "step_cpu_ms": steps, "cores": cores}


# ---------------------------------------------------------------------------- pipeline
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _process_groups(stack) -> dict[str, list]:
    """name → psutil processes (the child and its descendants; PostgreSQL: postmaster + backends)."""
    import psutil

    groups: dict[str, list] = {}
    for child in stack.children:
        p = psutil.Process(child.proc.pid)
        groups[child.name] = [p, *p.children(recursive=True)]
    services = stack._services
    if services is not None:
        for name, pid in (("postgres", services.postgres_pid()), ("redis", services.redis_pid())):
            if pid:
                p = psutil.Process(pid)
                groups[name] = [p, *p.children(recursive=True)]
    return groups


def _cpu(groups: dict[str, list], previous: dict[str, dict[int, float]] | None = None) -> dict[str, dict[int, float]]:
    """CPU seconds per process of each group; processes new since ``previous`` are included."""
    import psutil

    out: dict[str, dict[int, float]] = {}
    for name, procs in groups.items():
        out[name] = {}
        seen = list(procs)
        if name == "postgres" and procs:  # backends come and go
            try:
                seen = [procs[0], *procs[0].children(recursive=True)]
            except psutil.Error:
                pass
        for p in seen:
            try:
                t = p.cpu_times()
                out[name][p.pid] = t.user + t.system + getattr(t, "children_user", 0) + getattr(t, "children_system", 0)
            except psutil.Error:
                if previous and p.pid in previous.get(name, {}):
                    out[name][p.pid] = previous[name][p.pid]
    return out


def _stack_pids(stack) -> list[int]:
    """Every process of the stack (its children and their descendants, PostgreSQL's postmaster
    and backends, Redis), listed now."""
    return [p.pid for procs in _process_groups(stack).values() for p in procs]


def _upload(session, base: str, data: bytes, i: int) -> str:
    r = session.post(f"{base}/api/v1/images", files={"file": (f"meme{i}.png", data, "image/png")}, timeout=120)
    r.raise_for_status()
    return r.json()["job"]["id"]


def _wait_terminal(engine, job_ids: list[str], timeout: float) -> None:
    """Poll until every job is terminal. The polls run on the measured PostgreSQL: while the last
    job is not terminal only that one row is read (jobs finish roughly in upload order), so the
    bench's own statements stay a small share of the database's CPU."""
    from sqlalchemy import text

    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            last = conn.execute(text("SELECT status FROM processing_jobs WHERE id = CAST(:id AS uuid)"),
                                {"id": job_ids[-1]}).scalar_one_or_none()
            if last not in TERMINAL:
                done = -1
            else:
                done = conn.execute(text(
                    "SELECT count(*) FROM processing_jobs WHERE id = ANY(CAST(:ids AS uuid[])) AND status = ANY(:t)"),
                    {"ids": job_ids, "t": list(TERMINAL)}).scalar_one()
        if done >= len(job_ids):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"timeout: {'the last job not' if done < 0 else f'{done}/{len(job_ids)} jobs'} terminal")
        time.sleep(0.1)


def _agent_threads() -> int:
    """The local agent worker's concurrent calls (``lane_pool``: one per core)."""
    from app.stages.cpu import available_cores

    return available_cores()


def _idle_with_work(tasks: list[tuple[float, float, float]], threads: int) -> float:
    """Agent thread-seconds idle while an agent task waited: the integral over time of
    min(threads - running, queued) where positive — ``tasks`` (created, started, completed). A task
    counts as queued from its creation to its claim, running from its claim to its completion."""
    events = []
    for created, started, completed in tasks:
        events += [(created, 0, 1), (started, 0, -1), (started, 1, 1), (completed, 1, -1)]
    events.sort()
    queued = running = 0
    idle, last = 0.0, None
    for t, kind, delta in events:
        if last is not None:
            idle += max(0, min(threads - running, queued)) * (t - last)
        last = t
        if kind == 0:
            queued += delta
        else:
            running += delta
    return idle


def _busy(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


class Pipeline:
    """The default ``memeflow up`` stack under a temp dir, warmed with ``warm``; ``measure(images)``
    uploads a set and times it until every job is terminal. Use as a context manager."""

    def __init__(self, warm: list[bytes], env: dict[str, str], timeout: float,
                 worker_concurrency: int | None = None, pg_stats: bool = False,
                 components: tuple[str, ...] | None = None) -> None:
        self.components = components
        self.warm, self.env, self.timeout = warm, env, timeout
        self.pg_stats = pg_stats
        self.profile_oncpu = False
        self.perf_pg: Path | None = None
        self.worker_concurrency = worker_concurrency
        self.uploaded = 0

    def __enter__(self) -> Pipeline:
        import requests

        from app.cli.stack import Stack
        from app.config import Settings, reset_settings
        from app.db.engine import make_engine

        self.tmp = Path(tempfile.mkdtemp(prefix="memeflow-real-"))
        self.saved = {k: os.environ.get(k) for k in (*self.env, "MEMEFLOW_VAR_DIR", "MEMEFLOW_API_PORT",
                                                     "MEMEFLOW_FLOWER_PORT", "MEMEFLOW_LOG_LEVEL")}
        os.environ.update(self.env)
        os.environ.update(MEMEFLOW_VAR_DIR=str(self.tmp / "var"), MEMEFLOW_API_PORT=str(_free_port()),
                          MEMEFLOW_FLOWER_PORT=str(_free_port()), MEMEFLOW_LOG_LEVEL="WARNING")
        reset_settings()
        self.settings = Settings.from_env()
        if self.pg_stats:  # pg_stat_statements in the embedded cluster (a fresh one: var dir is new)
            from bench.common import preload_pg_stat_statements

            preload_pg_stat_statements(planning=True)
        self.stack = Stack(self.settings, components=self.components, echo=lambda *a, **k: None, start_timeout_s=180,
                           worker_concurrency=self.worker_concurrency)
        try:
            self.stack.start()
            self.base = f"http://127.0.0.1:{self.settings.api_port}"
            self.engine = make_engine(self.stack.database_url, pre_ping=False)
            self.session = requests.Session()
            if self.pg_stats:
                from bench.common import create_pg_stat_statements

                create_pg_stat_statements(self.engine)
            _wait_terminal(self.engine, self._upload_all(self.warm), self.timeout)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        import shutil

        from app.config import reset_settings

        self.stack.stop()
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reset_settings()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _upload_all(self, images: list[bytes]) -> list[str]:
        ids = [_upload(self.session, self.base, data, self.uploaded + i) for i, data in enumerate(images)]
        self.uploaded += len(images)
        return ids

    def idle(self, seconds: float) -> dict[str, float]:
        """CPU seconds per process group while the warm stack does nothing for ``seconds``."""
        groups = _process_groups(self.stack)
        cpu0 = _cpu(groups)
        time.sleep(seconds)
        cpu1 = _cpu(groups, cpu0)
        return {name: round(sum(v - cpu0.get(name, {}).get(pid, 0.0) for pid, v in cpu1[name].items()), 3)
                for name in cpu1}

    def measure(self, images: list[bytes], profile: Path | None = None) -> dict:
        import shutil
        import subprocess

        from sqlalchemy import text

        groups = _process_groups(self.stack)
        spies = []
        spy = shutil.which("py-spy")
        if profile is not None and spy:  # sample each lane worker and the API (collapsed stacks)
            profile.mkdir(parents=True, exist_ok=True)
            for name in ("visual", "agent", "embedding", "api", "webhooks", "flower"):
                for p in groups.get(name, [])[:3]:
                    idle = [] if self.profile_oncpu else ["--idle"]
                    spies.append(subprocess.Popen(
                        [spy, "record", "--nonblocking", "--threads", *idle, "-r", "50", "-f", "raw", "-o",
                         str(profile / f"{name}-{p.pid}.txt"), "-p", str(p.pid)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if self.pg_stats:
            with self.engine.begin() as conn:
                conn.execute(text("SELECT pg_stat_statements_reset()"))
        if self.perf_pg is not None and shutil.which("perf"):  # the PostgreSQL processes, on-CPU
            self.perf_pg.mkdir(parents=True, exist_ok=True)
            pg = groups.get("postgres", [])
            pg = [pg[0], *pg[0].children(recursive=True)] if pg else []
            spies.append(subprocess.Popen(
                ["perf", "record", "-F", "499", "-g", "-o", str(self.perf_pg / "postgres.perf.data"),
                 "-p", ",".join(str(p.pid) for p in pg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        cpu0 = _cpu(groups)
        sampler = CoreSampler(lambda: _stack_pids(self.stack)).__enter__()
        t0, start, bench0 = time.perf_counter(), time.time(), time.process_time()
        ids = self._upload_all(images)
        upload_s = time.perf_counter() - t0
        _wait_terminal(self.engine, ids, self.timeout)
        wall = time.perf_counter() - t0
        sampler.__exit__()
        bench_cpu = {"all": time.process_time() - bench0, "sampler": sampler.cpu_s}
        cpu1 = _cpu(groups, cpu0)
        for sp in spies:
            sp.send_signal(__import__("signal").SIGINT)
        for sp in spies:
            sp.wait(timeout=30)
        with self.engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT t.lane, extract(epoch FROM t.started_at), extract(epoch FROM t.completed_at)"
                " FROM tasks t WHERE t.job_id = ANY(CAST(:ids AS uuid[])) AND t.status = 'succeeded'"),
                {"ids": ids}).all()
            lat = sorted(float(x) for (x,) in conn.execute(text(
                "SELECT extract(epoch FROM completed_at - created_at) FROM processing_jobs"
                " WHERE id = ANY(CAST(:ids AS uuid[])) AND completed_at IS NOT NULL"), {"ids": ids}).all())
            statuses = dict(conn.execute(text(
                "SELECT status, count(*) FROM processing_jobs WHERE id = ANY(CAST(:ids AS uuid[])) GROUP BY status"),
                {"ids": ids}).all())
        with self.engine.connect() as conn:
            agent_rows = conn.execute(text(
                "SELECT extract(epoch FROM t.created_at), extract(epoch FROM t.started_at),"
                " extract(epoch FROM t.completed_at) FROM tasks t WHERE t.job_id = ANY(CAST(:ids AS uuid[]))"
                " AND t.lane = 'agent' AND t.status = 'succeeded'"), {"ids": ids}).all()
        # the window's busy cores: from the first upload to the last job's completion, in phases
        # around the agent lane (before its first task started, while it ran, after its last)
        end = max((float(c) for _a, _b, c in agent_rows), default=start)
        end = max([end, *(float(b) for _ln, _a, b in rows if b is not None)])
        agent_first = min((float(b) for _a, b, _c in agent_rows), default=start)
        agent_last = max((float(c) for _a, _b, c in agent_rows), default=end)
        cores = sampler.summary(start, end, [("before the first agent task", start, agent_first),
                                             ("agent running", agent_first, agent_last),
                                             ("after the last agent task", agent_last, end)])
        idle_waiting = _idle_with_work([(float(a), float(b), float(c)) for a, b, c in agent_rows], _agent_threads())
        if self.pg_stats:
            with self.engine.connect() as conn:
                top = conn.execute(text(
                    "SELECT calls, total_exec_time, total_plan_time, plans, left(regexp_replace(query, '\\s+', ' ', 'g'), 110)"
                    " FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 40")).all()
                utility = conn.execute(text(
                    "SELECT left(query, 30), sum(calls) FROM pg_stat_statements WHERE query ~* '^(ROLLBACK|DEALLOCATE|"
                    "COMMIT|BEGIN|SET|SHOW|SAVEPOINT|RELEASE|LISTEN|UNLISTEN|DISCARD)' GROUP BY 1 ORDER BY 2 DESC")).all()
                every = conn.execute(text(
                    "SELECT count(*), sum(calls), sum(plans), sum(total_exec_time), sum(total_plan_time)"
                    " FROM pg_stat_statements")).one()
            total = sum(float(r[1]) + float(r[2]) for r in top)
            print(f"      pg_stat_statements (top 40: {total:.0f} ms exec+plan, {total / len(images):.1f} ms/image):")
            for calls, ex, pl, plans, q in top:
                print(f"        {float(ex) + float(pl):8.1f} ms  {calls:6d} calls {plans:6d} plans  "
                      f"{float(ex) / max(calls, 1):6.3f} ms/call (+{float(pl) / max(plans, 1):.3f} ms/plan)  {q}")
            print(f"      every statement: {every[0]} kinds, {every[1]} calls, {every[2]} plans, exec {float(every[3]):.0f} ms,"
                  f" plan {float(every[4]):.0f} ms; utility: " + ", ".join(f"{q.strip()} {int(c)}" for q, c in utility))
        busy = {lane: _busy([(float(a), float(b)) for ln, a, b in rows if ln == lane and a is not None])
                for lane in LANES}
        task_s = {lane: sum(float(b) - float(a) for ln, a, b in rows if ln == lane and a is not None)
                  for lane in LANES}
        cpu = {name: round(sum(v - cpu0.get(name, {}).get(pid, 0.0) for pid, v in cpu1[name].items()), 2)
               for name in cpu1}
        if self.pg_stats:  # PostgreSQL's CPU by process kind (backends vs background processes)
            import psutil

            kinds: dict[str, float] = {}
            for pid, v in cpu1.get("postgres", {}).items():
                try:
                    title = " ".join(psutil.Process(pid).cmdline())
                except psutil.Error:
                    title = "gone"
                kind = "backend" if "[local]" in title or "127.0.0.1" in title else (
                    title.split(":", 1)[1].strip().split(" ")[0] if ":" in title else "postmaster")
                kinds[kind] = kinds.get(kind, 0.0) + v - cpu0.get("postgres", {}).get(pid, 0.0)
            print("      postgres CPU s by process: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(kinds.items())))
            user = system = 0.0  # since each process started (warm-up included): the split, not the amount
            for pid in cpu1.get("postgres", {}):
                with contextlib.suppress(psutil.Error):
                    t = psutil.Process(pid).cpu_times()
                    user, system = user + t.user, system + t.system
            print(f"      postgres processes' CPU since start: user {user:.2f} s, system {system:.2f} s")
            with self.engine.connect() as conn:
                db = conn.execute(text("SELECT xact_commit, sessions FROM pg_stat_database WHERE datname = current_database()")).one()
            print(f"      database totals since start: {db[0]} commits, {db[1]} sessions")
        # tasks claimed together share their started_at (one claim transaction's clock)
        batches = {lane: len({a for ln, a, _b in rows if ln == lane and a is not None}) for lane in LANES}
        # the run's end: how long after the upstream lane's last completion each lane's last one came
        # (a lane that waits for a batch to fill adds its wait here, where nothing more can come)
        last = {lane: max((float(b) for ln, _a, b in rows if ln == lane and b is not None), default=None)
                for lane in LANES}
        tail = {f"{up}->{down}": last[down] - last[up] for up, down in itertools.pairwise(LANES)
                if last[up] is not None and last[down] is not None}
        # the last embedding batch (its tasks share one claim time): how long after the last agent
        # completion it was claimed, how many it held, how long it ran until its last completion
        emb = [(float(a), float(b)) for ln, a, b in rows if ln == "embedding" and a is not None and b is not None]
        last_batch = None
        if emb and last["agent"] is not None:
            claimed = max(a for a, _ in emb)
            members = [b for a, b in emb if a == claimed]
            last_batch = {"claimed_after_agent_s": claimed - last["agent"], "n": len(members),
                          "ran_s": max(members) - claimed}
        return {"agent_idle_with_work_s": idle_waiting, "cores": cores, "bench_cpu_s": bench_cpu,
                "n": len(images), "wall_s": wall, "upload_s": upload_s, "images_per_s": len(images) / wall,
                "statuses": statuses, "busy_s": busy, "task_s": task_s, "cpu_s": cpu, "batches": batches,
                "tail_s": tail, "last_batch": last_batch,
                "job_latency_s": {"p50": lat[len(lat) // 2] if lat else None,
                                  "p90": lat[int(len(lat) * 0.9)] if lat else None, "max": lat[-1] if lat else None}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=80)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds: bare loops, then the pipeline")
    ap.add_argument("--procs", default=None, help="bare-loop process counts, e.g. 1,2 (default 1..cores)")
    ap.add_argument("--env", action="append", default=[], help="MEMEFLOW_X=Y for the pipeline (A/B)")
    ap.add_argument("--skip-bare", action="store_true")
    ap.add_argument("--order", choices=("alternate", "bare-first", "pipeline-first"), default="alternate",
                    help="which side runs first in a round (alternate: the bare loops in odd rounds, the pipeline"
                         " in even ones, so a drift of the box's speed over a run does not favour one side)")
    ap.add_argument("--worker-concurrency", type=int,
                    help="-c of every lane worker (a solo worker ignores it: the threads of the local agent's, A/B)")
    ap.add_argument("--agent-pool", choices=("threads", "prefork"),
                    help="the local agent worker's pool (A/B; default: app.cli.processes.lane_pool's), with -c its cores")
    ap.add_argument("--skip-pipeline", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--without", default="", help="comma-separated Stack components to leave out (A/B), e.g. flower")
    ap.add_argument("--pg-stats", action="store_true", help="print pg_stat_statements' top statements per round")
    ap.add_argument("--idle", type=float, default=0.0,
                    help="first measure the warm stack's CPU per process group over this many idle seconds")
    ap.add_argument("--profile-oncpu", action="store_true", help="--profile records on-CPU samples only (no --idle)")
    ap.add_argument("--profile", type=Path, help="py-spy (on PATH) the workers and API into this dir, last round")
    ap.add_argument("--perf-pg", type=Path, help="perf record (on PATH) PostgreSQL's processes into this dir, each round")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    procs = [int(x) for x in args.procs.split(",")] if args.procs else list(range(1, cores + 1))
    # every process count with the libraries' default threads (0: one per core, as a plain script
    # gets), and with one thread per call (which wastes no CPU on spinning intra-op pools)
    configs = sorted({(n, 0) for n in procs} | {(n, 1) for n in procs})
    env = dict(kv.split("=", 1) for kv in args.env)
    if args.agent_pool:  # the Stack picks each lane worker's pool with lane_pool: the agent's replaced
        import app.cli.stack as stack_mod

        default_pool = stack_mod.lane_pool

        def lane_pool(settings, lanes):
            pool, n = default_pool(settings, lanes)
            return (args.agent_pool, n) if "agent" in lanes and pool == "threads" else (pool, n)

        stack_mod.lane_pool = lane_pool
    components = None
    if args.without:
        from app.cli.stack import Stack

        components = tuple(c for c in Stack.DEFAULT if c not in args.without.split(","))
    print(f"# {platform.machine()}, {cores} CPUs, python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
          flush=True)
    all_images = memes(args.warmup + args.rounds * args.n, seed=101)
    warm = all_images[:args.warmup]
    sets = [all_images[args.warmup + r * args.n: args.warmup + (r + 1) * args.n] for r in range(args.rounds)]
    print(f"# {args.n} generated memes per round (+{args.warmup} warm-up), "
          f"{sum(map(len, sets[0])) / len(sets[0]) / 1024:.0f} KiB PNG on average; pipeline env {env or 'defaults'}"
          f"{', agent pool ' + args.agent_pool if args.agent_pool else ''}",
          flush=True)
    rounds = []
    with contextlib.ExitStack() as stack:
        pipe = None if args.skip_pipeline else stack.enter_context(Pipeline(
            warm, env, args.timeout, args.worker_concurrency, args.pg_stats, components))
        if pipe is not None:
            pipe.profile_oncpu = args.profile_oncpu
            pipe.perf_pg = args.perf_pg
        if pipe is not None and args.idle > 0:
            time.sleep(2.0)  # the warm-up's last completions settle
            idle = pipe.idle(args.idle)
            print(f"idle: CPU ms per second over {args.idle:.0f}s, per process group: " + ", ".join(
                f"{k} {1000 * v / args.idle:.1f}" for k, v in sorted(idle.items())) +
                f"; total {1000 * sum(idle.values()) / args.idle:.1f}", flush=True)
        for r, images in enumerate(sets):
            out: dict = {}

            def run_bare(r: int, images: list[bytes], out: dict) -> None:
                if not args.skip_bare:
                    out["bare"] = [bare_loop(images, n, t) for n, t in configs]
                    for b in out["bare"]:
                        print(f"[{r + 1}] bare loop  {b['images_per_s']:6.2f} images/s  ({b['procs']} process(es) x "
                              f"{b['threads'] or 'default'} thread(s), {b['wall_s']:.1f}s, CPU s {b['cpu_s']})", flush=True)
                        if b["threads"] == 1:
                            print("      calling thread's CPU ms per image by step: " + ", ".join(
                                f"{k} {v:.1f}" for k, v in b["step_cpu_ms"].items()), flush=True)
                        print_cores("bare", b["cores"])

            def run_pipeline(r: int, images: list[bytes], out: dict) -> None:
                if pipe is not None:
                    p = out["pipeline"] = pipe.measure(images, args.profile if r == len(sets) - 1 else None)
                    print(f"[{r + 1}] pipeline   {p['images_per_s']:6.2f} images/s  ({p['n']} in {p['wall_s']:.1f}s, "
                          f"uploads took {p['upload_s']:.1f}s, jobs {p['statuses']}, load {os.getloadavg()[0]:.1f})",
                          flush=True)
                    print("      lane busy s (union of task intervals) / summed task s: " + ", ".join(
                        f"{lane} {p['busy_s'][lane]:.1f}/{p['task_s'][lane]:.1f}" for lane in LANES) +
                        "; batches (distinct claim times): " + ", ".join(f"{k} {v}" for k, v in p["batches"].items()) +
                        "; job latency s (upload to done): " + ", ".join(
                            f"{k} {v:.2f}" for k, v in p["job_latency_s"].items() if v is not None) +
                        "; tail s (last completion after the upstream lane's last): " + ", ".join(
                            f"{k} {v:.2f}" for k, v in p["tail_s"].items()) +
                        ("" if not p["last_batch"] else
                         f" (the last embedding batch: claimed {1000 * p['last_batch']['claimed_after_agent_s']:.0f} ms after"
                         f" the last agent completion, {p['last_batch']['n']} task(s), ran"
                         f" {1000 * p['last_batch']['ran_s']:.0f} ms)") +
                        f"; agent threads idle while an agent task waited: {p['agent_idle_with_work_s']:.2f} thread-s"
                        f" ({100 * p['agent_idle_with_work_s'] / (_agent_threads() * p['wall_s']):.1f} % of"
                        f" {_agent_threads()} x wall)")
                    print("      CPU ms per image per process group: " + ", ".join(
                        f"{k} {1000 * v / p['n']:.1f}" for k, v in sorted(p["cpu_s"].items())) +
                        f"; total {1000 * sum(p['cpu_s'].values()) / p['n']:.1f}", flush=True)
                    print("      CPU s per process group: " + ", ".join(
                        f"{k} {v:.1f}" for k, v in sorted(p["cpu_s"].items())), flush=True)
                    print(f"      this bench process (upload client, poller, sampler): CPU {p['bench_cpu_s']['all']:.2f} s,"
                          f" of which the core sampler {p['bench_cpu_s']['sampler']:.2f} s", flush=True)
                    print_cores("pipeline", p["cores"])
            pipeline_first = args.order == "pipeline-first" or (args.order == "alternate" and r % 2 == 1)
            for part in ((run_pipeline, run_bare) if pipeline_first else (run_bare, run_pipeline)):
                part(r, images, out)
            if "bare" in out and "pipeline" in out:
                best = max(out["bare"], key=lambda b: b["images_per_s"])
                out["ratio"] = out["pipeline"]["images_per_s"] / best["images_per_s"]
                default = max((b for b in out["bare"] if b["threads"] == 0), key=lambda b: b["images_per_s"])
                out["ratio_default_threads"] = out["pipeline"]["images_per_s"] / default["images_per_s"]
                print(f"[{r + 1}] ratio      {out['ratio']:.2f}x the best bare loop ({best['procs']} process(es) x "
                      f"{best['threads'] or 'default'} thread(s)); {out['ratio_default_threads']:.2f}x the best with "
                      f"the libraries' default threads ({default['procs']} process(es))", flush=True)
            rounds.append(out)
    ratios = [o["ratio"] for o in rounds if "ratio" in o]
    if ratios:
        import statistics

        print(f"ratios {', '.join(f'{x:.2f}' for x in ratios)}; median {statistics.median(ratios):.2f}x")
        dr = [o["ratio_default_threads"] for o in rounds if "ratio" in o]
        print(f"ratios to the default-threads loop {', '.join(f'{x:.2f}' for x in dr)}; "
              f"median {statistics.median(dr):.2f}x")
        cpu = [sum(o["pipeline"]["cpu_s"].values()) / o["pipeline"]["n"] for o in rounds if "pipeline" in o]
        bare_cpu = [sum(b["cpu_s"]) / o["pipeline"]["n"] for o in rounds if "bare" in o for b in o["bare"]
                    if b["threads"] == 1 and b["procs"] == max(procs)]
        if cpu and bare_cpu:
            print(f"CPU ms per image: pipeline (every process) {1000 * statistics.median(cpu):.0f}, bare loop "
                  f"({max(procs)} x 1 thread) {1000 * statistics.median(bare_cpu):.0f}")
    if args.json:
        args.json.write_text(json.dumps({"env": env, "rounds": rounds}, indent=2, default=str))


if __name__ == "__main__":
    main()
