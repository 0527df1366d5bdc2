"""The :class:`Stack` supervisor: the whole memeflow stack as child processes.

:class:`Stack` starts them for ``memeflow up`` (and ``memeflow demo``): embedded services unless
URLs are given, migrations, then API + one worker per lane + a webhooks worker (issue 20) + beat +
Flower — the SPEC §7 building blocks and nothing else (every lane worker also serves the
``maintenance`` queue, so no dedicated maintenance worker is needed); it checks each is up,
supervises them, and stops everything cleanly (terminate, wait, kill stragglers, then the
embedded services it started). The command line of each child comes from :mod:`app.cli.processes`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from app.cli.processes import (
    LANES,
    WORKER_QUEUES,
    api_cmd,
    beat_cmd,
    flower_cmd,
    flower_env,
    lane_pool,
    lane_prefetch,
    settings_env,
    worker_cmd,
)
from app.config import Settings


class StackError(RuntimeError):
    """A part of the stack failed to start or died."""


@dataclass
class Child:
    name: str
    cmd: list[str]
    env: dict[str, str]
    log_path: Path
    port: int | None = None  # a TCP port that must accept connections for "started"
    stop_grace_s: float | None = None  # None: the stack's stop timeout
    proc: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)

    def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # Own session: Ctrl-C in the terminal reaches the supervisor only, which stops children in order.
            self.proc = subprocess.Popen(
                self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: BLE001 - psutil missing or the process is gone
        return []


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


class Stack:
    """The whole memeflow stack as supervised child processes.

    ``Stack(settings).start()`` returns once every part is up (raises :class:`StackError`
    otherwise, after stopping what it started); ``supervise()`` blocks until a stop signal;
    ``stop()`` is idempotent. ``components`` selects parts (default: :attr:`DEFAULT`; add
    ``maintenance`` for a dedicated maintenance worker). ``worker_pool`` / ``worker_concurrency``
    unset: each lane's default (:func:`lane_pool`).
    """

    ALL = ("api", *LANES, "webhooks", "maintenance", "beat", "flower")
    #: What ``memeflow up`` runs: no dedicated maintenance worker (the lane workers serve its queue).
    DEFAULT = ("api", *LANES, "webhooks", "beat", "flower")

    def __init__(
        self, settings: Settings, *, components: tuple[str, ...] | None = None, worker_pool: str | None = None,
        worker_concurrency: int | None = None, start_timeout_s: float = 60.0, stop_timeout_s: float = 15.0,
        echo=click.echo,
    ) -> None:
        self.settings = settings
        self.components = tuple(components or self.DEFAULT)
        unknown = set(self.components) - set(self.ALL)
        if unknown:
            raise ValueError(f"unknown components: {sorted(unknown)}")
        self.worker_pool = worker_pool
        self.worker_concurrency = worker_concurrency
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.echo = echo
        self.children: list[Child] = []
        self.database_url: str | None = None
        self.broker_url: str | None = None
        self._services = None  # EmbeddedServices this stack started (and so stops)
        self._stopping = False
        self._client = None  # Celery client app on this stack's broker (pings)
        var_dir = Path(settings.var_dir).resolve()
        self.log_dir = var_dir / "log"
        self.run_dir = var_dir / "run"

    # ------------------------------------------------------------------ start
    def start(self) -> Stack:
        from app.netguard import check_bind

        if "api" in self.components:
            check_bind(self.settings, self.settings.api_host)  # before anything starts
        try:
            self._start_services()
            self._migrate()
            for child in self._plan():
                self.children.append(child)
                child.spawn()
            self._wait_started()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_services(self) -> None:
        from app.runtime import embedded_services

        s = self.settings
        if s.database_url and s.broker_url:
            self.database_url, self.broker_url = s.database_url, s.broker_url
            return
        services = embedded_services(s)
        already = services.urls() is not None
        urls = services.start()
        if not already:
            self._services = services
        self.database_url = s.database_url or urls.database_url
        self.broker_url = s.broker_url or urls.broker_url

    def _migrate(self) -> None:
        from app.db.engine import upgrade_to_head

        upgrade_to_head(self.database_url)

    def child_env(self, **extra: str) -> dict[str, str]:
        """The environment of a child: this stack's settings as MEMEFLOW_* plus resolved URLs."""
        env = dict(os.environ)
        env.update(settings_env(self.settings))
        env.update(
            MEMEFLOW_DATABASE_URL=str(self.database_url), MEMEFLOW_BROKER_URL=str(self.broker_url),
            MEMEFLOW_VAR_DIR=str(Path(self.settings.var_dir).resolve()),
        )
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        env.update(extra)
        return env

    def _plan(self) -> list[Child]:
        s, host = self.settings, socket.gethostname()
        plan: list[Child] = []
        for name in self.components:
            log_path = self.log_dir / f"{name}.log"
            if name == "api":
                plan.append(Child(name, api_cmd(s.api_host, s.api_port), self.child_env(), log_path, port=s.api_port))
            elif name in WORKER_QUEUES:
                pool, concurrency = lane_pool(s, [name])
                pool = self.worker_pool or pool
                cmd = worker_cmd([name], pool=pool, concurrency=self.worker_concurrency or concurrency,
                                 node=f"{name}@{host}", prefetch=lane_prefetch(s, [name], pool))
                plan.append(Child(name, cmd, self.child_env(MEMEFLOW_WORKER_LANES=name), log_path))
            elif name == "beat":
                self.run_dir.mkdir(parents=True, exist_ok=True)
                plan.append(Child(name, beat_cmd(self.run_dir / "celerybeat-schedule"), self.child_env(), log_path))
            elif name == "flower":
                # Flower logs the SIGTERM but its event thread keeps it alive; it holds no state: kill soon.
                env = flower_env(self.child_env(), s.flower_basic_auth)
                plan.append(Child(name, flower_cmd(s.flower_port), env, log_path, port=s.flower_port,
                                  stop_grace_s=2.0))
        return plan

    def worker_nodes(self) -> list[str]:
        host = socket.gethostname()
        return [f"{c.name}@{host}" for c in self.children if c.name in WORKER_QUEUES]

    def _wait_started(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        pending_ports = {c.name: c.port for c in self.children if c.port}
        pending_workers = set(self.worker_nodes())
        while True:
            for child in self.children:
                if not child.alive:
                    raise StackError(f"{child.name} exited with {child.proc.returncode}; see {child.log_path}")
            for name, port in list(pending_ports.items()):
                if _port_open(port, "127.0.0.1"):
                    del pending_ports[name]
            if pending_workers:
                pending_workers -= set(self.ping_workers(pending_workers))
            if not pending_ports and not pending_workers:
                return
            if time.monotonic() > deadline:
                missing = sorted(pending_ports) + sorted(pending_workers)
                raise StackError(f"not started within {self.start_timeout_s:.0f}s: {', '.join(missing)}; "
                                 f"logs in {self.log_dir}")
            time.sleep(0.5)

    def ping_workers(self, nodes) -> list[str]:
        """Names of ``nodes`` that answer a Celery control ping."""
        from app.publisher import celery_app_for

        if self._client is None:
            self._client = celery_app_for(str(self.broker_url), "memeflow-supervisor")
        try:
            replies = self._client.control.ping(destination=list(nodes), timeout=1.0)
        except Exception as exc:  # noqa: BLE001 - broker not up yet
            self._last_ping_error = exc
            return []
        return [name for reply in replies or [] for name in reply]

    # ------------------------------------------------------------------ run
    def urls(self) -> dict[str, str]:
        s, out = self.settings, {}
        if "api" in self.components:
            out["api"] = f"http://{s.api_host}:{s.api_port}/"
            out["library"] = f"http://{s.api_host}:{s.api_port}/"
            out["ops"] = f"http://{s.api_host}:{s.api_port}/ops"
        if "flower" in self.components:
            out["flower"] = f"http://127.0.0.1:{s.flower_port}/"
        out["postgres"] = str(self.database_url)
        out["redis"] = str(self.broker_url)
        return out

    def supervise(self, stop_event=None, *, max_restarts_per_min: int = 3) -> None:
        """Restart children that die (bounded); return when ``stop_event`` is set.

        Raises :class:`StackError` when a child keeps dying or an embedded service is gone.
        """
        while not (stop_event and stop_event.wait(1.0)):
            if stop_event is None:
                time.sleep(1.0)
            if self._services is not None and self._services.urls() is None:
                raise StackError("an embedded service died")
            for child in self.children:
                if child.alive or self._stopping:
                    continue
                now = time.monotonic()
                child.restarts = [t for t in child.restarts if now - t < 60] + [now]
                if len(child.restarts) > max_restarts_per_min:
                    raise StackError(f"{child.name} keeps exiting; see {child.log_path}")
                self.echo(f"{child.name} exited ({child.proc.returncode}); restarting", err=True)
                child.spawn()

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Terminate children (beat first, API/workers next), wait, kill stragglers, stop services."""
        self._stopping = True
        procs = [c for c in self.children if c.proc is not None]
        tree: dict[int, list[int]] = {c.proc.pid: _descendants(c.proc.pid) for c in procs if c.alive}
        for child in sorted(procs, key=lambda c: c.name != "beat"):
            if child.alive:
                _kill(child.proc.pid, signal.SIGTERM)
        started = time.monotonic()
        for child in procs:
            grace = self.stop_timeout_s if child.stop_grace_s is None else child.stop_grace_s
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=max(started + grace - time.monotonic(), 0.1))
            if child.alive:
                if child.stop_grace_s is None:
                    self.echo(f"{child.name} did not stop in time; killing", err=True)
                _kill(child.proc.pid, signal.SIGKILL)
        for child in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=5)
        for pids in tree.values():
            for pid in pids:  # pool children / gunicorn workers left behind
                _kill(pid, signal.SIGKILL)
        self.children = []
        if self._services is not None:
            self._services.stop()
            self._services = None
