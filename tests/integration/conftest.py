"""Real Celery worker and beat processes against the session's PostgreSQL and Redis.

Each test gets its own database (see tests/conftest.py) and its own Redis database index
(flushed first), so queues never leak between tests. Processes are started with fast intervals
and deterministic or counting providers, and are always stopped by pid at teardown.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import pytest
import redis as redis_lib
from PIL import Image

from app.config import Settings
from tests.conftest import poll_until

ROOT = Path(__file__).resolve().parents[2]
# Redis database indexes (0–15): the long-lived stacks (the session's live stack, the quality gate's
# module stack) keep workers consuming one index for many tests, so each has its own, never handed
# to a test: a test given the same index would have its hints taken by their workers (which find no
# such task in their database and drop them) and wait for work that never runs.
LIVE_STACK_REDIS_DB = 15
GATE_REDIS_DB = 14
_TEST_REDIS_DBS = 13  # per-test indexes cycle over 1..13
_redis_db = itertools.count(0)


def redis_url_with_db(url: str, db: int) -> str:
    return url.rsplit("/", 1)[0] + f"/{db}"


def make_publisher(broker_url: str):
    """A CeleryHintPublisher on a Celery app pointed at ``broker_url`` (the test's own)."""
    from app.publisher import CeleryHintPublisher, celery_app_for

    app = celery_app_for(broker_url, "memeflow-test")
    return CeleryHintPublisher(app, cooldown_s=0.2), app


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class CeleryCluster:
    """Starts real ``celery worker``/``beat`` processes for one test and cleans them up."""

    settings: Settings
    broker_url: str
    tmp: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        s = self.settings
        env = dict(os.environ)
        env.update(
            MEMEFLOW_DATABASE_URL=str(s.database_url), MEMEFLOW_BROKER_URL=self.broker_url,
            MEMEFLOW_VAR_DIR=str(Path(s.var_dir).resolve()), MEMEFLOW_LEASE_S=str(s.lease_s),
            MEMEFLOW_HEARTBEAT_S=str(s.heartbeat_s), MEMEFLOW_SWEEP_INTERVAL_S=str(s.sweep_interval_s),
            MEMEFLOW_REHINT_GRACE_S=str(s.rehint_grace_s), MEMEFLOW_BACKOFF_BASE_S=str(s.backoff_base_s),
            MEMEFLOW_BACKOFF_MAX_S=str(s.backoff_max_s), MEMEFLOW_VISUAL_PROVIDER=s.visual_provider,
            MEMEFLOW_AGENT_PROVIDER=s.agent_provider, MEMEFLOW_TEXT_PROVIDER=s.text_provider,
            MEMEFLOW_EMBEDDING_BATCH_SIZE=str(s.embedding_batch_size), MEMEFLOW_LOG_JSON="1",
            MEMEFLOW_SEARCH_CONFIG_GRACE_S=str(s.search_config_grace_s),
            MEMEFLOW_LOG_LEVEL="INFO", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1",
        )
        if s.storage_dir:
            env["MEMEFLOW_STORAGE_DIR"] = str(s.storage_dir)
        env.update(self.extra_env)
        env.update(extra)
        return env

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> Proc:
        log_path = self.tmp / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def worker(self, *lanes: str, name: str | None = None, wait: bool = True, pool: str = "solo",
               concurrency: int = 1, prefetch: int = 1, **env: str) -> Proc:
        """A worker (solo pool unless ``pool``) consuming ``lanes``; returns once it logs ``ready``."""
        from app.cli.processes import worker_cmd

        name = name or f"{'-'.join(lanes)}-{uuid.uuid4().hex[:6]}"
        cmd = worker_cmd(list(lanes), pool=pool, concurrency=concurrency, node=f"{name}@{socket.gethostname()}",
                         heartbeat=False, prefetch=prefetch)
        proc = self._spawn(name, cmd, self.env(MEMEFLOW_WORKER_LANES=",".join(lanes), **env))
        if wait:
            self.wait_ready(proc)
        return proc

    def wait_ready(self, proc: Proc, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if not proc.alive:
                raise AssertionError(f"{proc.name} exited {proc.popen.returncode}:\n{proc.log()[-3000:]}")
            return " ready." in proc.log()

        poll_until(ready, timeout=timeout, interval=0.1, what=f"{proc.name} ready")

    def beat(self, name: str | None = None) -> Proc:
        from app.cli.processes import beat_cmd

        name = name or f"beat-{uuid.uuid4().hex[:6]}"
        return self._spawn(name, beat_cmd(self.tmp / f"{name}-schedule"), self.env())

    def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.popen.pid, sig)
        proc.popen.wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.popen.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(timeout=10)


@pytest.fixture()
def broker_url(services) -> str:
    """The session Redis with a database index of this test's own, flushed."""
    url = redis_url_with_db(services.redis_url(), 1 + (next(_redis_db) % _TEST_REDIS_DBS))
    client = redis_lib.Redis.from_url(url)
    client.flushdb()
    client.close()
    return url


@pytest.fixture()
def call_log(tmp_path) -> Path:
    return tmp_path / "calls.log"


@pytest.fixture()
def it_settings(settings, broker_url) -> Settings:
    return settings.replace(broker_url=broker_url, log_json=True, embedding_batch_size=8)


@pytest.fixture()
def cluster(it_settings, broker_url, tmp_path, call_log) -> CeleryCluster:
    c = CeleryCluster(it_settings, broker_url, tmp_path, extra_env={"MEMEFLOW_TEST_CALL_LOG": str(call_log)})
    yield c
    c.stop_all()


@pytest.fixture()
def orch(engine, it_settings):
    from app.orchestrator import Orchestrator

    return Orchestrator(engine, it_settings)


@pytest.fixture()
def publisher(broker_url):
    pub, app = make_publisher(broker_url)
    yield pub
    with contextlib.suppress(Exception):
        app.close()


def png_bytes(index: int, size: int = 24) -> bytes:
    """A small PNG unique to ``index``."""
    img = Image.new("RGB", (size, size), ((index * 37) % 256, (index * 91) % 256, (index // 7 * 53) % 256))
    img.putpixel((index % size, (index // size) % size), (255 - (index % 256), index % 251, 7))
    img.putpixel((0, 0), (index % 256, (index >> 8) % 256, (index >> 16) % 256))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def ingest(orch, settings: Settings, index: int, scope: str = "local", **kwargs):
    """Store a unique PNG and ingest it like the API does; returns the IngestResult."""
    import hashlib

    data = png_bytes(index)
    sha = hashlib.sha256(data).hexdigest()
    namespace = orch.ensure_scope(scope)
    key = f"{namespace}/{sha}.png"
    path = settings.storage_path / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return orch.ingest_image(scope, sha256=sha, media_type="image/png", extension=".png", size_bytes=len(data),
                             width=24, height=24, storage_key=key, **kwargs)


class Sweeper:
    """Calls ``orch.sweep()`` every ``interval`` in a thread and publishes its hints (like beat)."""

    def __init__(self, orch, publisher, interval: float) -> None:
        self.orch, self.publisher, self.interval = orch, publisher, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors: list[BaseException] = []

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                report = self.orch.sweep()
                self.publisher.publish(report.hints)
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def job_statuses(engine, job_ids) -> dict[str, int]:
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT status, count(*) FROM processing_jobs WHERE id = ANY(CAST(:ids AS uuid[])) GROUP BY status"),
            {"ids": [str(j) for j in job_ids]},
        ).all()
    return {status: n for status, n in rows}


def wait_jobs_terminal(engine, job_ids, timeout: float, ok: Callable[[dict], bool] | None = None) -> dict:
    total = len(list(job_ids))

    def done():
        counts = job_statuses(engine, job_ids)
        active = counts.get("queued", 0) + counts.get("running", 0)
        return counts if active == 0 and sum(counts.values()) == total else None

    return poll_until(done, timeout=timeout, interval=0.25, what=f"{total} jobs terminal")


PYTHON = sys.executable


# ---------------------------------------------------------------------------- a live stack with real providers
@dataclass
class LiveStack:
    """Real Celery workers (one per lane) with the real default providers, on a session database.

    Shared by the reduced demo path and the CLI tests: the models load once per worker process.
    """

    settings: Settings
    cluster: CeleryCluster
    engine: object

    def env(self, **extra: str) -> dict[str, str]:
        return self.cluster.env(**extra)

    def cli(self, *args: str, timeout: float = 180.0, **env: str) -> subprocess.CompletedProcess:
        """``memeflow ARGS`` as a subprocess against this stack (URLs set: nothing embedded starts)."""
        return subprocess.run([PYTHON, "-m", "app.cli", *map(str, args)], check=False, env=self.env(COLUMNS="200", **env),
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def live_stack(services, template_db, tmp_path_factory):
    from app.db.engine import make_engine
    from tests.conftest import admin_connect

    name = f"t_live_{uuid.uuid4().hex[:12]}"
    conn = admin_connect(services)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name} TEMPLATE {template_db}")
    conn.close()
    broker = redis_url_with_db(services.redis_url(), LIVE_STACK_REDIS_DB)
    client = redis_lib.Redis.from_url(broker)
    client.flushdb()
    client.close()
    tmp = tmp_path_factory.mktemp("live-stack")
    settings = Settings(
        database_url=services.postgres_url(name), broker_url=broker, var_dir=tmp / "var",
        lease_s=30.0, heartbeat_s=1.0, sweep_interval_s=0.5, rehint_grace_s=1.0, backoff_base_s=0.05,
        backoff_max_s=0.5, visual_provider="perceptual-v1", agent_provider="local-ocr",
        embedding_batch_size=8, log_json=True,  # the default text provider (e5 + MiniLM)
    )
    cluster = CeleryCluster(settings, broker, tmp)
    engine = make_engine(settings.database_url)
    try:
        from app.cli.processes import lane_pool, lane_prefetch

        for lane in ("visual", "agent", "embedding"):  # as `memeflow up` runs them (local-ocr: threads)
            pool, concurrency = lane_pool(settings, [lane])
            cluster.worker(lane, name=f"live-{lane}", wait=False, pool=pool, concurrency=concurrency,
                           prefetch=lane_prefetch(settings, [lane], pool))
        for proc in cluster.procs:
            cluster.wait_ready(proc)
        yield LiveStack(settings, cluster, engine)
    finally:
        cluster.stop_all()
        engine.dispose()
        conn = admin_connect(services)
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.close()
