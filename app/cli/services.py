"""``memeflow up`` (the whole stack until Ctrl-C) and the embedded services' status/stop."""

from __future__ import annotations

import contextlib
import threading

import click

from app.cli.common import cli_settings, friendly_errors
from app.runtime import embedded_services


@click.command()
@click.option("--no-flower", is_flag=True, help="Do not start Flower.")
@click.option("--pool", default=None, type=click.Choice(["solo", "prefork", "threads"]),
              help="Celery pool of each lane worker [default: threads for a local agent, else solo].")
@click.option("-c", "--concurrency", type=click.IntRange(1), default=None,
              help="Processes/threads per lane worker [default: a local agent's cores, else 1].")
@click.option("--maintenance-worker", is_flag=True,
              help="Also run a dedicated maintenance worker (the lane workers serve its queue anyway).")
@friendly_errors
def up(no_flower: bool, pool: str | None, concurrency: int | None, maintenance_worker: bool) -> None:
    """Run the whole stack until Ctrl-C: embedded services (unless URLs are set), migrations,
    API, one worker per lane (each also runs the sweeps), a webhooks worker, beat and Flower."""
    from app.cli.stack import Stack, StackAlreadyRunning, StackError, stop_on_signals

    settings = cli_settings()
    wanted = Stack.DEFAULT + (("maintenance",) if maintenance_worker else ())
    components = tuple(c for c in Stack.ALL if c in wanted and not (no_flower and c == "flower"))
    stack = Stack(settings, components=components, worker_pool=pool, worker_concurrency=concurrency)
    stop = threading.Event()
    stop_on_signals(stop)  # Ctrl-C, kill, and the terminal closing (SIGHUP) all stop in order
    try:
        _say("starting memeflow…")
        stack.start()
        for name, url in stack.urls().items():
            _say(f"{name:9} {url}")
        _say(f"logs      {stack.log_dir}")
        _say("running; press Ctrl-C to stop")
        stack.supervise(stop)
    except StackAlreadyRunning as exc:  # nothing of ours started: nothing to stop
        _say(f"error: {exc}", err=True)
        raise SystemExit(ALREADY_RUNNING_EXIT) from None
    except StackError as exc:
        _say(f"error: {exc}", err=True)
        _stop(stack)
        raise SystemExit(1) from None
    except BaseException:
        _stop(stack)
        raise
    _stop(stack)


#: ``memeflow up``'s exit code when another stack runs on the same var dir.
ALREADY_RUNNING_EXIT = 3


def _say(message: str, *, err: bool = False) -> None:
    """Echo; once the terminal is gone (SIGHUP) writing fails, which must not stop the stop."""
    with contextlib.suppress(OSError, ValueError):
        click.echo(message, err=err)


def _stop(stack) -> None:
    _say("stopping…")
    stack.stop()
    _say("stopped")


@click.command("services-status")
def services_status() -> None:
    """Show whether the embedded PostgreSQL and Redis are running."""
    status = embedded_services(cli_settings()).status()
    for name, info in status.items():
        click.echo(f"{name:9} {'running pid ' + str(info['pid']) if info['pid'] else 'stopped'}")


@click.command("services-stop")
def services_stop() -> None:
    """Stop the embedded PostgreSQL and Redis."""
    embedded_services(cli_settings()).stop()
    click.echo("stopped")
