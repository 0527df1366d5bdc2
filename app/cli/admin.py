"""``memeflow scopes create|list|limits`` and ``memeflow tokens create|revoke|list``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timezone

import click

from app.cli.common import database_url, friendly_errors, scope_param
from app.cli.safe_text import printable


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
    click.echo(f"{'created' if created else 'exists'}: {printable(sid)} (storage namespace {namespace})")


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
        click.echo(f"{printable(r['id'])}\t{r['images']} images\tnamespace {r['storage_namespace']}"
                   f"\tcreated {r['created_at']:%Y-%m-%d %H:%M}")


def _limit(value: str | None) -> int | None:
    return None if value is None or value == "default" else int(value)


_LIMIT_HELP = "0 = unlimited, 'default' = back to the global MEMEFLOW_* setting"
#: The largest value each limit's column holds (scope_limits: max_bytes bigint, the others integer).
_LIMIT_MAX = {"max_bytes": 2**63 - 1, "max_images": 2**31 - 1, "uploads_per_minute": 2**31 - 1,
              "processing_per_minute": 2**31 - 1}


@scopes.command("limits")
@click.argument("scope_id", callback=scope_param)
@click.option("--max-bytes", default=None, help=f"stored bytes of the scope ({_LIMIT_HELP})")
@click.option("--max-images", default=None, help=f"images of the scope ({_LIMIT_HELP})")
@click.option("--uploads-per-minute", default=None, help=f"uploads per minute, per token ({_LIMIT_HELP})")
@click.option("--processing-per-minute", default=None,
              help=f"processing requests (process, retry, batches) per minute, per token ({_LIMIT_HELP})")
@friendly_errors
def scopes_limits(scope_id: str, **options: str | None) -> None:
    """Show or set SCOPE_ID's limits (overrides of the global settings) and its usage."""
    from app.cli.common import connected

    values = {}
    for name, raw in options.items():
        if raw is None:
            continue
        try:
            values[name] = _limit(raw)
        except ValueError:
            raise click.BadParameter(f"{raw!r} is not a number or 'default'", param_hint=f"--{name.replace('_', '-')}") from None
        if values[name] is not None and values[name] > _LIMIT_MAX[name]:  # the database would refuse it
            raise click.BadParameter(f"{raw!r} is more than {_LIMIT_MAX[name]}", param_hint=f"--{name.replace('_', '-')}")
    with connected() as c:
        report = c.orch.set_scope_limits(scope_id, values)
    effective = report["effective"]
    click.echo(f"{scope_id!r}: {report['image_count']} images, {report['stored_bytes']} bytes stored")
    for name in ("max_bytes", "max_images", "uploads_per_minute", "processing_per_minute"):
        value = getattr(effective, name)
        source = "scope" if report["overrides"].get(name) is not None else "global"
        click.echo(f"  {name.replace('_', '-')}: {value or 'unlimited'} ({source})")


@click.group()
def tokens() -> None:
    """API tokens (MEMEFLOW_AUTH=token): stored hashed, shown once."""


@tokens.command("create")
@click.argument("scope_id", callback=scope_param)
@click.option("--name", "-n", required=True, help="A label for the token, unique in the scope.")
@click.option("--expires-in", "expires_in", default=None, metavar="DURATION",
              help="Stop accepting the token after this long: 30d, 12h, 90m, 2w (default: never).")
@friendly_errors
def tokens_create(scope_id: str, name: str, expires_in: str | None) -> None:
    """Create a token for SCOPE_ID and print it (only this once)."""
    from app.auth import create_token, parse_duration

    try:
        ttl = parse_duration(expires_in) if expires_in is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--expires-in") from None
    with _engine() as engine:
        try:
            info, token = create_token(engine, scope_id, name, expires_in=ttl)
        except (LookupError, ValueError) as exc:
            raise click.ClickException(printable(exc)) from None
    expiry = f", expires {info.expires_at:%Y-%m-%d %H:%M %Z}" if info.expires_at else ""
    click.echo(f"token id {info.id} for scope {printable(info.scope_id)} ({printable(info.name)}){expiry}; "
               "store it now, it is not shown again:", err=True)
    click.echo(token)


@tokens.command("revoke")
@click.argument("id_or_name")
@click.option("--scope", "scope_id", default=None, callback=scope_param,
              help="The token's scope; required when the name exists in several scopes.")
@friendly_errors
def tokens_revoke(id_or_name: str, scope_id: str | None) -> None:
    """Revoke the token with this id or name (requests with it then get 401).

    A name used in several scopes is refused (nothing revoked) unless --scope picks one."""
    from app.auth import AmbiguousTokenName, revoke_token

    with _engine() as engine:
        try:
            revoked = revoke_token(engine, id_or_name, scope_id)
        except (AmbiguousTokenName, LookupError) as exc:
            raise click.ClickException(printable(exc)) from None
    if not revoked:
        raise click.ClickException(printable(f"no token {id_or_name!r}"))
    for info in revoked:
        click.echo(f"revoked {info.id} ({printable(info.scope_id)}/{printable(info.name)})")


@tokens.command("list")
@click.option("--scope", "scope_id", default=None, callback=scope_param)
@friendly_errors
def tokens_list(scope_id: str | None) -> None:
    """List tokens (never the token values)."""
    from app.auth import list_tokens

    with _engine() as engine:
        try:
            rows = list_tokens(engine, scope_id)
        except LookupError as exc:
            raise click.ClickException(printable(exc)) from None
    for t in rows:
        state = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
        if t.expires_at and not t.revoked_at:
            past = t.expires_at <= datetime.now(timezone.utc)
            state = f"{'expired' if past else 'active, expires'} {t.expires_at:%Y-%m-%d %H:%M %Z}"
        click.echo(f"{t.id}\t{printable(t.scope_id)}\t{printable(t.name)}\t{state}")
