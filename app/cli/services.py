"""``memeflow up``: run the embedded PostgreSQL and Redis (and later the whole stack) until Ctrl-C."""

from __future__ import annotations

import signal
import threading

import click

from app.cli.common import cli_settings, friendly_errors
from app.runtime import embedded_services


@click.command()
@friendly_errors
def up() -> None:
    """Start the embedded services in the foreground; Ctrl-C stops them cleanly."""
    settings = cli_settings()
    services = embedded_services(settings)
    urls = services.start()
    from app.db.engine import upgrade_to_head

    upgrade_to_head(urls.database_url)
    click.echo(f"postgres: {urls.database_url}")
    click.echo(f"redis:    {urls.broker_url}")
    click.echo("running; press Ctrl-C to stop")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            if services.urls() is None:
                click.echo("error: an embedded service died", err=True)
                raise SystemExit(1)
    except KeyboardInterrupt:
        pass
    finally:
        click.echo("stopping…")
        services.stop()
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
