"""``memeflow db upgrade|current``: Alembic migrations against the configured database."""

from __future__ import annotations

import click

from app.cli.common import database_url, friendly_errors


@click.group()
def db() -> None:
    """Database schema migrations."""


@db.command()
@friendly_errors
def upgrade() -> None:
    """Apply all migrations (alembic upgrade head)."""
    from app.db.engine import upgrade_to_head

    url = database_url(start=True)
    upgrade_to_head(url, on_wait=lambda message: click.echo(f"note: {message}", err=True))
    click.echo("database at head")


@db.command()
@friendly_errors
def current() -> None:
    """Show the database's migration revision and the code's head."""
    from app.db.engine import make_engine, migration_status

    engine = make_engine(database_url())
    with engine.connect() as conn:
        cur, head = migration_status(conn)
    engine.dispose()
    click.echo(f"current: {cur or '(none)'}  head: {head}" + ("" if cur == head else "  (upgrade needed)"))
