"""Helpers shared by CLI commands: settings, URLs and an engine, with shell-friendly errors."""

from __future__ import annotations

import functools
import sys

import click

from app.config import Settings, SettingsError, get_settings
from app.embedded import EmbeddedServiceError


def cli_settings() -> Settings:
    try:
        return get_settings()
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None


def friendly_errors(fn):
    """Turn expected operational errors into a one-line message and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (EmbeddedServiceError, SettingsError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)

    return wrapper


def database_url(start: bool = False) -> str:
    from app.runtime import resolve_urls

    return resolve_urls(cli_settings(), start=start).database_url
