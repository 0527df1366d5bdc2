"""``memeflow up`` (the whole stack until Ctrl-C) and the embedded services' status/stop."""

from __future__ import annotations

import signal
import threading

import click

from app.cli.common import cli_settings, friendly_errors
from app.runtime import embedded_services


@click.command()
@click.option("--no-flower", is_flag=True, help="Do not start Flower.")
@click.option("--pool", default=None, type=click.Choice(["solo", "prefork", "threads"]),
              help="Celery pool of each lane worker [default: threads for a local agent, else solo].")
@click.option("-c", "--concurrency", type=int, default=None,
              help="Processes/threads per lane worker [default: a local agent's cores, else 1].")
@click.option("--maintenance-worker", is_flag=True,
              help="Also run a dedicated maintenance worker (the lane workers serve its queue anyway).")
@friendly_errors
def up(no_flower: bool, pool: str | None, concurrency: int | None, maintenance_worker: bool) -> None:
    """Run the whole stack until Ctrl-C: embedded services (unless URLs are set), migrations,
    API, one worker per lane (each also runs the sweeps), a webhooks worker, beat and Flower."""
    from app.cli.stack import Stack, StackError

    settings = cli_settings()
    wanted = Stack.DEFAULT + (("maintenance",) if maintenance_worker else ())
    components = tuple(c for c in Stack.ALL if c in wanted and not (no_flower and c == "flower"))
    stack = Stack(settings, components=components, worker_pool=pool, worker_concurrency=concurrency)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        click.echo("starting memeflow…")
        stack.start()
        for name, url in stack.urls().items():
            click.echo(f"{name:9} {url}")
        click.echo(f"logs      {stack.log_dir}")
        click.echo("running; press Ctrl-C to stop")
        stack.supervise(stop)
    except StackError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    finally:
        click.echo("stopping…")
        stack.stop()
        click.echo("stopped")


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
