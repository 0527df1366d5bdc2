"""The :class:`Stack` supervisor: the whole memeflow stack as child processes.

:class:`Stack` starts them for ``memeflow up`` (and ``memeflow demo``): embedded services unless
URLs are given, migrations, then API + one worker per lane + a webhooks worker (issue 20) + beat +
Flower — the SPEC §7 building blocks and nothing else (every lane worker also serves the
``maintenance`` queue, so no dedicated maintenance worker is needed); it checks each is up,
supervises them, and stops everything cleanly (terminate, wait, kill stragglers, then the
embedded services it started). The command line of each child comes from :mod:`app.cli.processes`.

One stack per var dir: :class:`Stack` holds an exclusive lock on ``var/run/stack.lock`` from
``start()`` to ``stop()``, so a second ``memeflow up`` on the same var dir fails at once instead of
sharing (and then stopping) the first one's PostgreSQL and Redis. The children die with the
supervisor: on Linux each gets ``PR_SET_PDEATHSIG`` (SIGTERM; SIGKILL for Flower, which ignores
SIGTERM), so a supervisor killed with SIGKILL or by the OOM killer leaves no API still holding its
port; SIGHUP (the terminal closed) stops the stack like Ctrl-C (:func:`stop_on_signals`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import click

from app.cli.children import Child, descendants, listens_on, port_open, signal_quietly
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
from app.config import STAGE_TIMEOUT_EXIT, Settings


def without_password(url: object) -> str:
    """``url`` with its password shown as ``***``: ``memeflow up`` prints the URLs it serves, and a
    terminal's output ends up in journals and CI logs (MEMEFLOW_DATABASE_URL and
    MEMEFLOW_BROKER_URL may carry credentials)."""
    from urllib.parse import urlsplit, urlunsplit

    text_ = str(url)
    try:
        parts = urlsplit(text_)
        password = parts.password
    except ValueError:
        return text_
    if not password:
        return text_
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostport}"))


class StackError(RuntimeError):
    """A part of the stack failed to start or died."""


class StackAlreadyRunning(StackError):
    """Another stack already runs on this var dir."""


#: Seconds the agent worker gets on top of its calls' timeout and the completion drain to stop.
AGENT_STOP_MARGIN_S = 10.0

#: Signals that stop ``memeflow up`` / ``demo --keep`` cleanly: Ctrl-C, ``kill``, and the terminal closing.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stop_on_signals(event: threading.Event) -> None:
    """Set ``event`` on SIGINT, SIGTERM or SIGHUP (main thread only): the supervisor then stops the
    stack in order. Without SIGHUP, closing the terminal killed the supervisor and left every child
    and both embedded servers running."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: event.set())


def agent_stop_grace_s(settings: Settings) -> float:
    """How long a stopping agent worker may take: a call in flight may run until its deadline
    (``Settings.agent_call_max_s``: ``agent_deadline_s``, longer than one read's ``agent_timeout_s``),
    then its completion is committed (at most ``COMPLETION_DRAIN_S``). Killing it sooner throws a
    paid result away (the job ends ``unknown_execution``)."""
    from app.config import COMPLETION_DRAIN_S

    return settings.agent_call_max_s + COMPLETION_DRAIN_S + AGENT_STOP_MARGIN_S


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
        self._embedded = None  # EmbeddedServices this stack uses (started by it or found running)
        self._lock_fd: int | None = None  # var/run/stack.lock, held from start() to stop()
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
        self._lock()
        try:
            self._start_services()
            self._migrate()
            plan = self._plan()
            for child in plan:
                if child.port and port_open(child.port):
                    raise StackError(f"{child.name}: port {child.port} is already in use (another memeflow, "
                                     f"or another program); stop it or choose another port")
            for child in plan:
                self.children.append(child)
                child.spawn()
            self._wait_started()
        except BaseException:
            self.stop()
            raise
        return self

    def _lock(self) -> None:
        """Take ``var/run/stack.lock`` (exclusive, non-blocking) or raise :class:`StackAlreadyRunning`."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir / "stack.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StackAlreadyRunning(f"memeflow is already running on {self.run_dir.parent} (pid {holder}); "
                                      "stop it first, or use another MEMEFLOW_VAR_DIR") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)  # closing the last descriptor releases the flock
            self._lock_fd = None

    def _say(self, message: str) -> None:
        """Echo to stderr; a terminal that is gone (SIGHUP) must not stop the stop."""
        with contextlib.suppress(OSError, ValueError):
            self.echo(message, err=True)

    def _start_services(self) -> None:
        from app.runtime import embedded_services

        s = self.settings
        if s.database_url and s.broker_url:
            self.database_url, self.broker_url = s.database_url, s.broker_url
            return
        services = embedded_services(s)
        already = services.urls() is not None
        urls = services.start()
        self._embedded = services
        if not already:
            self._services = services
        self.database_url = s.database_url or urls.database_url
        self.broker_url = s.broker_url or urls.broker_url

    def _migrate(self) -> None:
        from app.db.engine import upgrade_to_head

        upgrade_to_head(self.database_url, on_wait=self._say)

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
                # a paid call in flight finishes and commits before the agent worker is killed
                grace = max(agent_stop_grace_s(s), self.stop_timeout_s) if name == "agent" else None
                plan.append(Child(name, cmd, self.child_env(MEMEFLOW_WORKER_LANES=name), log_path,
                                  stop_grace_s=grace))
            elif name == "beat":
                self.run_dir.mkdir(parents=True, exist_ok=True)
                plan.append(Child(name, beat_cmd(self.run_dir / "celerybeat-schedule"), self.child_env(), log_path))
            elif name == "flower":
                # Flower logs the SIGTERM but its event thread keeps it alive; it holds no state: kill soon.
                env = flower_env(self.child_env(), s.flower_basic_auth)
                plan.append(Child(name, flower_cmd(s.flower_port), env, log_path, port=s.flower_port,
                                  stop_grace_s=2.0, death_signal=signal.SIGKILL))
        return plan

    def worker_nodes(self) -> list[str]:
        host = socket.gethostname()
        return [f"{c.name}@{host}" for c in self.children if c.name in WORKER_QUEUES]

    def _wait_started(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        pending_ports = {c.name: c for c in self.children if c.port}
        pending_workers = set(self.worker_nodes())
        while True:
            for child in self.children:
                if not child.alive:
                    raise StackError(f"{child.name} exited with {child.proc.returncode}; see {child.log_path}")
            for name, child in list(pending_ports.items()):
                # ours only if our child is alive once the port answers, and (where psutil can
                # tell) listens on it itself: a leftover server on the port is not our API
                if (port_open(child.port, "127.0.0.1") and child.alive
                        and listens_on(child.proc.pid, child.port) is not False):
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
        out["postgres"] = without_password(self.database_url)
        out["redis"] = without_password(self.broker_url)
        return out

    def supervise(self, stop_event=None, *, max_restarts_per_min: int = 3) -> None:
        """Restart children that die (bounded); return when ``stop_event`` is set.

        Raises :class:`StackError` when a child keeps dying or an embedded service is gone (also
        one this stack found running rather than started: nothing else restarts it).
        """
        while not (stop_event and stop_event.wait(1.0)):
            if stop_event is None:
                time.sleep(1.0)
            if self._embedded is not None and self._embedded.urls() is None:
                raise StackError(f"the embedded PostgreSQL or Redis under {self._embedded.var_dir} stopped "
                                 "(`memeflow services-status` shows which)")
            for child in self.children:
                if child.alive or self._stopping:
                    continue
                now = time.monotonic()
                child.restarts = [t for t in child.restarts if now - t < 60] + [now]
                if len(child.restarts) > max_restarts_per_min:
                    raise StackError(f"{child.name} keeps exiting; see {child.log_path}")
                why = (" — a provider call ran past its MEMEFLOW_<LANE>_RUN_MAX_S (the watchdog); see its log"
                       if child.proc.returncode == STAGE_TIMEOUT_EXIT else "")
                self._say(f"{child.name} exited ({child.proc.returncode}{why}); restarting")
                child.spawn()

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Terminate children (beat first, API/workers next), wait, kill stragglers, stop services."""
        self._stopping = True
        procs = [c for c in self.children if c.proc is not None]
        tree: dict[int, list[int]] = {c.proc.pid: descendants(c.proc.pid) for c in procs if c.alive}
        for child in sorted(procs, key=lambda c: c.name != "beat"):
            if child.alive:
                signal_quietly(child.proc.pid, signal.SIGTERM)
        started = time.monotonic()
        # the shortest graces first: a long one (the agent's) must not delay killing the others
        for child in sorted(procs, key=lambda c: self._grace(c)):
            grace = self._grace(child)
            if grace > self.stop_timeout_s:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=max(started + self.stop_timeout_s - time.monotonic(), 0.1))
                if child.alive:
                    self._say(f"waiting up to {grace:.0f}s for {child.name} to finish its calls in flight")
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=max(started + grace - time.monotonic(), 0.1))
            if child.alive:
                if grace >= self.stop_timeout_s:
                    self._say(f"{child.name} did not stop in time; killing")
                signal_quietly(child.proc.pid, signal.SIGKILL)
        for child in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=5)
        for pids in tree.values():
            for pid in pids:  # pool children / gunicorn workers left behind
                signal_quietly(pid, signal.SIGKILL)
        self.children = []
        try:
            if self._services is not None:
                self._services.stop()
                self._services = None
        finally:
            self._embedded = None
            self._unlock()

    def _grace(self, child: Child) -> float:
        return self.stop_timeout_s if child.stop_grace_s is None else child.stop_grace_s
