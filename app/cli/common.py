"""Helpers shared by CLI commands: settings, URLs and an engine, with shell-friendly errors."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click

from app.cli.safe_text import printable
from app.config import Settings, SettingsError, get_settings
from app.embedded import EmbeddedServiceError


class Seconds(click.FloatRange):
    """A number of seconds at or above ``min``: a finite number only ('nan' and 'inf' parse as
    floats, and compare false with every bound, so a deadline of nan never passes and a sleep of
    nan raises)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        out = super().convert(value, param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return out


def cli_settings() -> Settings:
    try:
        return get_settings()
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None


def friendly_errors(fn):
    """Turn expected operational errors into a one-line message and exit code 1.

    Every message is made terminal-safe (:func:`printable`): it may quote user-controlled text."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except click.ClickException as exc:
            exc.message = printable(exc.message)
            raise
        except (EmbeddedServiceError, SettingsError) as exc:
            click.echo(f"error: {printable(exc)}", err=True)
            sys.exit(1)
        except Exception as exc:
            from sqlalchemy.exc import OperationalError

            from app.db.engine import ExtensionUnavailable, sqlstate
            from app.orchestrator.errors import OrchestratorError

            if isinstance(exc, ExtensionUnavailable):
                click.echo(f"error: {printable(exc)}", err=True)
                sys.exit(1)
            if isinstance(exc, OperationalError):
                first_line = (str(exc.orig).strip().splitlines() or [""])[0]
                state = sqlstate(exc.orig)
                if state and not state.startswith("08") and state not in _SERVER_GONE:
                    # reached, but it cancelled the statement (a statement or lock timeout, …)
                    click.echo(f"error: the database refused the operation (SQLSTATE {state}): "
                               f"{printable(first_line)}", err=True)
                else:
                    click.echo(f"error: cannot reach the database: {printable(first_line)}", err=True)
                sys.exit(1)
            if isinstance(exc, OrchestratorError):
                click.echo(f"error: {getattr(exc, 'code', 'error')}: {printable(exc)}", err=True)
                sys.exit(1)
            raise

    return wrapper


#: SQLSTATEs of an OperationalError that mean the server went away (admin or crash shutdown, cannot
#: connect now); class 08 (connection exceptions) too. Any other code came from a server that answered.
_SERVER_GONE = frozenset({"57P01", "57P02", "57P03"})


def scope_param(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback for a scope id argument or option: refused as the API refuses it (no '/',
    '\\', control characters, '.' or '..'; 1..128 characters), before it reaches SQL; None passes."""
    from app.scopes import InvalidScopeId, validate_scope_id

    if value is None:
        return None
    try:
        return validate_scope_id(value)
    except InvalidScopeId as exc:
        raise click.BadParameter(printable(exc), ctx, param) from None


def database_url(start: bool = False) -> str:
    from app.runtime import resolve_urls

    return resolve_urls(cli_settings(), start=start).database_url


@dataclass
class Connected:
    """What an operator command needs: settings with resolved URLs, an engine, the orchestrator."""

    settings: Settings
    engine: Any
    orch: Any


@contextmanager
def connected() -> Iterator[Connected]:
    """Connect to the configured stack without starting anything.

    With MEMEFLOW_DATABASE_URL and MEMEFLOW_BROKER_URL set those are used; otherwise the embedded
    servers under MEMEFLOW_VAR_DIR must already run (else :class:`EmbeddedServiceError`, which
    :func:`friendly_errors` turns into a message and exit code 1).
    """
    from app.db.engine import make_engine
    from app.orchestrator import Orchestrator
    from app.runtime import resolve_urls

    settings = cli_settings()
    urls = resolve_urls(settings, start=False)
    settings = settings.replace(database_url=urls.database_url, broker_url=urls.broker_url)
    engine = make_engine(settings.database_url)
    try:
        yield Connected(settings, engine, Orchestrator(engine, settings))
    finally:
        engine.dispose()


def require_scope(c: Connected, scope_id: str, *, unless_default: bool = False) -> None:
    """Refuse a scope that does not exist — exit 1 with a message, nothing created — so that a
    command over a scope's images never reads a mistyped ``--scope`` as an empty library, nor
    makes it a new scope (``process-all`` did). Uploads and ``ingest`` create scopes.

    ``unless_default``: a read of the default scope (``--scope`` not given) before anything was
    uploaded to it shows an empty library, as before."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    if unless_default and ctx is not None and ctx.get_parameter_source("scope_id") is ParameterSource.DEFAULT:
        return
    if not c.orch.scope_exists(scope_id):
        raise click.ClickException(
            f"scope {scope_id!r} does not exist ('memeflow scopes list' shows the scopes; "
            "an upload or 'memeflow ingest' creates one)")
