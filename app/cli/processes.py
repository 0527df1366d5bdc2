"""Process commands (``api``, ``worker``, ``beat``, ``flower``) and the command lines they run.

Each command runs one building block in the foreground, as docker-compose runs one per container.
The supervisor that starts them all for ``memeflow up`` is :class:`app.cli.stack.Stack`; it builds
its children from the command lines here (``api_cmd``, ``worker_cmd``, ``beat_cmd``, ``flower_cmd``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
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
    loglevel: str = "INFO", heartbeat: bool = True, prefetch: int = 1,
) -> list[str]:
    """``celery worker`` consuming ``lanes``' queues (node name ``<lanes>@<host>`` unless given);
    ``prefetch``: its prefetch multiplier (celeryconfig's is 1, see :func:`lane_prefetch`)."""
    node = node or f"{'+'.join(lanes)}-{os.getpid()}@{socket.gethostname()}"
    cmd = celery_cmd(
        "worker", "-Q", ",".join(lanes), "-P", pool, "-c", str(concurrency), "-n", node, "-l", loglevel,
        "--without-gossip", "--without-mingle",
    )
    if prefetch != 1:
        cmd += ["--prefetch-multiplier", str(prefetch)]
    if not heartbeat:
        cmd.append("--without-heartbeat")
    return cmd


def lane_pool(settings: Settings, lanes) -> tuple[str, int]:
    """The Celery pool and concurrency a worker of ``lanes`` runs by default.

    A local CPU-bound agent (``local-ocr``) runs one call per core in threads of one process
    (``threads`` pool, concurrency = the cores it may use; its model calls are single-threaded
    and release the GIL): each hint is one call, so every core stays busy even when tasks
    trickle in one at a time. A dedicated embedding worker: ``solo``, or on a bigger box threads,
    one per ``Settings.embedding_threads`` (each runs its own batches). Everything else: one
    ``solo`` process (a paid agent's concurrency is its lane limit and batch; the visual lane
    batches). A webhooks-only worker:
    threads x8 (deliveries wait on the network, one subscription per thread)."""
    if WEBHOOKS in lanes and all(lane in (WEBHOOKS, "maintenance") for lane in lanes):
        return WEBHOOK_POOL, WEBHOOK_THREADS
    from app.stages.cpu import available_cores

    if "agent" in lanes and settings.agent_is_local:
        return "threads", available_cores()
    if set(lanes) == {"embedding"}:
        threads = settings.embedding_threads(available_cores())
        if threads > 1:  # a big box: batches run side by side, one core each (docs/performance-log.md §41)
            return "threads", threads
    return "solo", 1


#: The prefetch multiplier of a local agent's threads worker (see :func:`lane_prefetch`).
LOCAL_AGENT_PREFETCH = 2


def lane_prefetch(settings: Settings, lanes, pool: str) -> int:
    """The prefetch multiplier a worker of ``lanes`` on ``pool`` runs with.

    1 (celeryconfig's) for every worker but a local agent's threads pool, which reserves the next
    hint of each thread while the thread still runs its call (``LOCAL_AGENT_PREFETCH``): with 1,
    a thread that finished waited for its ack, the next fetch and the dispatch (10–20 ms of an
    idle core per ≈ 130 ms OCR call, docs/performance-log.md §31). A reserved hint is only a wake-up:
    the claim in PostgreSQL still decides which task runs, and a worker that dies leaves its
    reserved messages to redelivery (late acks) or the sweep's re-hint."""
    if pool == "threads" and "agent" in lanes and settings.agent_is_local:
        return LOCAL_AGENT_PREFETCH
    return 1


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
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port (default MEMEFLOW_API_PORT).")
@click.option("--workers", type=click.IntRange(1), default=2, show_default=True, help="gunicorn worker processes.")
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
@click.option("-c", "--concurrency", type=click.IntRange(1), default=None,
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
    _exec(worker_cmd(list(lanes), pool=pool, concurrency=concurrency, node=node, loglevel=loglevel,
                     prefetch=lane_prefetch(s, lanes, pool)), env)


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
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port (default MEMEFLOW_FLOWER_PORT).")
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Bind address (0.0.0.0 in a container; set MEMEFLOW_FLOWER_BASIC_AUTH then).")
@friendly_errors
def flower(port: int | None, address: str) -> None:
    """Run Flower (MEMEFLOW_FLOWER_BASIC_AUTH=user:password enables basic auth; it reaches Flower
    through its environment, never its command line). A non-loopback address needs basic auth."""
    s = cli_settings()
    check_flower_bind(s, address)
    _exec(flower_cmd(port or s.flower_port, address), flower_env(_urls_env(s), s.flower_basic_auth))
