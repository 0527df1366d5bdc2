"""``memeflow scopes create|list`` and ``memeflow tokens create|revoke|list``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import click

from app.cli.common import database_url, friendly_errors


@contextlib.contextmanager
def _engine() -> Iterator:
    from app.db.engine import make_engine

    engine = make_engine(database_url())
    try:
        yield engine
    finally:
        engine.dispose()


@click.group()
def scopes() -> None:
    """Tenants (scopes): each has its own images, jobs and tokens."""


@scopes.command("create")
@click.argument("scope_id")
@friendly_errors
def scopes_create(scope_id: str) -> None:
    """Create scope SCOPE_ID (no-op if it exists)."""
    from app.auth import create_scope
    from app.scopes import InvalidScopeId

    with _engine() as engine:
        try:
            sid, namespace, created = create_scope(engine, scope_id)
        except InvalidScopeId as exc:
            raise click.BadParameter(str(exc), param_hint="SCOPE_ID") from None
    click.echo(f"{'created' if created else 'exists'}: {sid} (storage namespace {namespace})")


@scopes.command("list")
@friendly_errors
def scopes_list() -> None:
    """List scopes with their image counts."""
    from app.auth import list_scopes

    with _engine() as engine:
        rows = list_scopes(engine)
    if not rows:
        click.echo("no scopes")
    for r in rows:
        click.echo(f"{r['id']}\t{r['images']} images\tnamespace {r['storage_namespace']}\tcreated {r['created_at']:%Y-%m-%d %H:%M}")


@click.group()
def tokens() -> None:
    """API tokens (MEMEFLOW_AUTH=token): stored hashed, shown once."""


@tokens.command("create")
@click.argument("scope_id")
@click.option("--name", "-n", required=True, help="A label for the token, unique in the scope.")
@friendly_errors
def tokens_create(scope_id: str, name: str) -> None:
    """Create a token for SCOPE_ID and print it (only this once)."""
    from app.auth import create_token

    with _engine() as engine:
        try:
            info, token = create_token(engine, scope_id, name)
        except (LookupError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"token id {info.id} for scope {info.scope_id} ({info.name}); store it now, it is not shown again:", err=True)
    click.echo(token)


@tokens.command("revoke")
@click.argument("id_or_name")
@click.option("--scope", "scope_id", default=None, help="Only revoke a token of this scope.")
@friendly_errors
def tokens_revoke(id_or_name: str, scope_id: str | None) -> None:
    """Revoke the token with this id or name (requests with it then get 401)."""
    from app.auth import revoke_token

    with _engine() as engine:
        revoked = revoke_token(engine, id_or_name, scope_id)
    if not revoked:
        raise click.ClickException(f"no token {id_or_name!r}")
    for info in revoked:
        click.echo(f"revoked {info.id} ({info.scope_id}/{info.name})")


@tokens.command("list")
@click.option("--scope", "scope_id", default=None)
@friendly_errors
def tokens_list(scope_id: str | None) -> None:
    """List tokens (never the token values)."""
    from app.auth import list_tokens

    with _engine() as engine:
        rows = list_tokens(engine, scope_id)
    for t in rows:
        state = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
        click.echo(f"{t.id}\t{t.scope_id}\t{t.name}\t{state}")
