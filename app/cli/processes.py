"""Process commands (``api``, ``worker``, ``beat``, ``flower``) and the :class:`Stack` supervisor.

Each command runs one building block in the foreground, as docker-compose runs one per container.
:class:`Stack` starts them all as child processes for ``memeflow up`` (and ``memeflow demo``):
embedded services unless URLs are given, migrations, then API + one worker per lane + a webhooks
worker (issue 20) + beat + Flower — the SPEC §7 building blocks and nothing else (every lane worker also serves the
``maintenance`` queue, so no dedicated maintenance worker is needed); it checks each is up,
supervises them, and stops everything cleanly (terminate, wait, kill stragglers, then the
embedded services it started).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from app.cli.common import cli_settings, friendly_errors
from app.config import Settings
from app.db.enums import Lane

LANES = tuple(lane.value for lane in Lane)  # the stage lanes
WEBHOOKS = "webhooks"
WORKER_QUEUES = (*LANES, WEBHOOKS, "maintenance")
#: A webhooks worker delivers to several receivers at once (threads: each delivery mostly waits on
#: the network), so one hanging receiver holds one thread for at most MEMEFLOW_WEBHOOK_TIMEOUT_S.
WEBHOOK_POOL, WEBHOOK_THREADS = "threads", 8


CELERY_APP = "app.worker.celery_app:celery_app"


class StackError(RuntimeError):
    """A part of the stack failed to start or died."""


# ---------------------------------------------------------------------------- command lines
def celery_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", CELERY_APP, *args]


def worker_cmd(
    lanes: list[str] | tuple[str, ...], *, pool: str = "solo", concurrency: int = 1, node: str | None = None,
    loglevel: str = "INFO", heartbeat: bool = True,
) -> list[str]:
    """``celery worker`` consuming ``lanes``' queues (node name ``<lanes>@<host>`` unless given)."""
    node = node or f"{'+'.join(lanes)}-{os.getpid()}@{socket.gethostname()}"
    cmd = celery_cmd(
        "worker", "-Q", ",".join(lanes), "-P", pool, "-c", str(concurrency), "-n", node, "-l", loglevel,
        "--without-gossip", "--without-mingle",
    )
    if not heartbeat:
        cmd.append("--without-heartbeat")
    return cmd


def lane_pool(settings: Settings, lanes) -> tuple[str, int]:
    """The Celery pool and concurrency a worker of ``lanes`` runs by default.

    A local CPU-bound agent (``local-ocr``) runs one call per core in threads of one process
    (``threads`` pool, concurrency = the cores it may use; its model calls are single-threaded
    and release the GIL): each hint is one call, so every core stays busy even when tasks
    trickle in one at a time. Everything else: one ``solo`` process (a paid agent's concurrency
    is its lane limit and batch; the visual and embedding lanes batch). A webhooks-only worker:
    threads x8 (deliveries wait on the network, one subscription per thread)."""
    if WEBHOOKS in lanes and all(lane in (WEBHOOKS, "maintenance") for lane in lanes):
        return WEBHOOK_POOL, WEBHOOK_THREADS
    if "agent" in lanes and settings.agent_is_local:
        from app.stages.cpu import available_cores

        return "threads", available_cores()
    return "solo", 1


def beat_cmd(schedule_file: Path, *, loglevel: str = "INFO") -> list[str]:
    return celery_cmd("beat", "-s", str(schedule_file), "--pidfile=", "-l", loglevel)


def flower_cmd(port: int, address: str = "127.0.0.1") -> list[str]:
    """``celery flower``; credentials never go on the command line (see :func:`flower_env`)."""
    return celery_cmd("flower", f"--port={port}", f"--address={address}")


def flower_env(env: dict[str, str], basic_auth: str | None) -> dict[str, str]:
    """``env`` with Flower's basic auth in ``FLOWER_BASIC_AUTH`` (Flower reads ``FLOWER_<option>``).

    A process's environment is readable only by its own user and root, its command line by every
    local user (``ps``), so the credentials travel here and only here."""
    env = dict(env)
    env.pop("FLOWER_BASIC_AUTH", None)
    if basic_auth:
        env["FLOWER_BASIC_AUTH"] = basic_auth
    return env


def check_flower_bind(settings: Settings, address: str) -> None:
    """Flower can revoke and terminate tasks: no credentials means loopback only (or an opt-in)."""
    from app.netguard import UnsafeBind, is_loopback

    if settings.flower_basic_auth or settings.allow_unauthenticated_remote or is_loopback(address):
        return
    raise UnsafeBind(
        f"refusing to serve Flower on {address} without MEMEFLOW_FLOWER_BASIC_AUTH=user:password "
        "(or set MEMEFLOW_ALLOW_UNAUTHENTICATED_REMOTE=1 if a trusted network or proxy guards it)"
    )


def api_cmd(host: str, port: int, workers: int = 2) -> list[str]:
    """gunicorn serving ``app.api.wsgi:app`` with :mod:`app.api.gunicorn_conf` (threaded workers,
    bounded requests, the bind guard); Flask's dev server if gunicorn is missing."""
    with contextlib.suppress(ImportError):
        import gunicorn  # noqa: F401

        bare = host.strip("[]")
        return [
            sys.executable, "-m", "gunicorn", "-c", "python:app.api.gunicorn_conf", "app.api.wsgi:app",
            "-b", f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}", "-w", str(workers),
        ]
    return [sys.executable, "-m", "flask", "--app", "app.api.wsgi:app", "run", "--host", host, "--port", str(port)]


def settings_env(settings: Settings) -> dict[str, str]:
    """``settings`` as MEMEFLOW_* variables, so a child process reads the same configuration."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if value is None:
            continue
        out[f"MEMEFLOW_{f.name.upper()}"] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out


# ---------------------------------------------------------------------------- the supervisor
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

    ALL = ("api", "visual", "agent", "embedding", "webhooks", "maintenance", "beat", "flower")
    #: What ``memeflow up`` runs: no dedicated maintenance worker (the lane workers serve its queue).
    DEFAULT = ("api", "visual", "agent", "embedding", "webhooks", "beat", "flower")

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
                cmd = worker_cmd([name], pool=self.worker_pool or pool,
                                 concurrency=self.worker_concurrency or concurrency, node=f"{name}@{host}")
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
        from app.worker.celery_app import celery_app_for

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


# ---------------------------------------------------------------------------- commands
def _exec(cmd: list[str], env: dict[str, str] | None = None) -> None:
    """Replace this process with ``cmd`` (signals go straight to it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(cmd[0], cmd, env or dict(os.environ))


def _urls_env(settings: Settings) -> dict[str, str]:
    """Environment for a building block: explicit URLs, never starting embedded services."""
    from app.worker.broker import broker_url_for, database_url_for

    env = dict(os.environ)
    env["MEMEFLOW_BROKER_URL"] = broker_url_for(settings)
    if not settings.database_url:
        with contextlib.suppress(Exception):
            env["MEMEFLOW_DATABASE_URL"] = database_url_for(settings)
    return env


@click.command()
@click.option("--host", default=None, help="Bind address (default MEMEFLOW_API_HOST).")
@click.option("--port", type=int, default=None, help="Port (default MEMEFLOW_API_PORT).")
@click.option("--workers", type=int, default=2, show_default=True, help="gunicorn worker processes.")
@friendly_errors
def api(host: str | None, port: int | None, workers: int) -> None:
    """Serve the REST API (gunicorn app.api.wsgi:app).

    With MEMEFLOW_AUTH=none only a loopback address is accepted (MEMEFLOW_ALLOW_UNAUTHENTICATED_REMOTE=1
    overrides); MEMEFLOW_ALLOWED_HOSTS lists the Host names it answers."""
    from app.netguard import check_bind

    s = cli_settings()
    host = host or s.api_host
    check_bind(s, host)
    env = _urls_env(s)
    env["MEMEFLOW_API_HOST"] = host  # the default Host allow-list includes the bind address
    _exec(api_cmd(host, port or s.api_port, workers), env)


@click.command()
@click.option("--lane", "lanes", multiple=True, required=True, type=click.Choice(WORKER_QUEUES),
              help="Queue(s) to consume; repeat for several. `maintenance` runs sweeps and batch seeding, "
                   "`webhooks` delivers webhook events.")
@click.option("--maintenance/--no-maintenance", "serve_maintenance", default=True, show_default=True,
              help="Also consume the `maintenance` queue (sweeps, batch seeding). Turn off only when a "
                   "dedicated `--lane maintenance` worker runs.")
@click.option("--pool", default=None, type=click.Choice(["solo", "prefork", "threads"]),
              help="Celery pool [default: threads for a local agent (local-ocr) or a webhooks worker, else solo].")
@click.option("-c", "--concurrency", type=int, default=None,
              help=f"[default: the cores for a local agent's threads, {WEBHOOK_THREADS} for a webhooks worker, else 1]")
@click.option("-n", "--node", default=None, help="Celery node name (default <lanes>-<pid>@<host>).")
@click.option("--loglevel", default="INFO", show_default=True)
@friendly_errors
def worker(
    lanes: tuple[str, ...], serve_maintenance: bool, pool: str | None, concurrency: int | None, node: str | None,
    loglevel: str,
) -> None:
    """Run a Celery worker for one lane (or several); loads only those lanes' models.

    It also serves the `maintenance` queue unless --no-maintenance, so lane workers + beat alone
    run every sweep."""
    s = cli_settings()
    env = _urls_env(s)
    env["MEMEFLOW_WORKER_LANES"] = ",".join(lanes)
    env["MEMEFLOW_WORKER_MAINTENANCE"] = "1" if serve_maintenance else "0"
    default_pool, default_concurrency = lane_pool(s, lanes)
    pool, concurrency = pool or default_pool, concurrency or default_concurrency
    _exec(worker_cmd(list(lanes), pool=pool, concurrency=concurrency, node=node, loglevel=loglevel), env)


@click.command()
@click.option("--schedule", type=click.Path(path_type=Path), default=None,
              help="Beat schedule file (default <var>/run/celerybeat-schedule).")
@friendly_errors
def beat(schedule: Path | None) -> None:
    """Run celery beat: the reconcile sweep every MEMEFLOW_SWEEP_INTERVAL_S (safe to run twice)."""
    s = cli_settings()
    run_dir = Path(s.var_dir).resolve() / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    _exec(beat_cmd(schedule or run_dir / "celerybeat-schedule"), _urls_env(s))


@click.command()
@click.option("--port", type=int, default=None, help="Port (default MEMEFLOW_FLOWER_PORT).")
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Bind address (0.0.0.0 in a container; set MEMEFLOW_FLOWER_BASIC_AUTH then).")
@friendly_errors
def flower(port: int | None, address: str) -> None:
    """Run Flower (MEMEFLOW_FLOWER_BASIC_AUTH=user:password enables basic auth; it reaches Flower
    through its environment, never its command line). A non-loopback address needs basic auth."""
    s = cli_settings()
    check_flower_bind(s, address)
    _exec(flower_cmd(port or s.flower_port, address), flower_env(_urls_env(s), s.flower_basic_auth))
