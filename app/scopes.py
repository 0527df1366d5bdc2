"""Scope (tenant) ids: validated at every boundary before they reach SQL or a file path."""

from __future__ import annotations

import re

LOCAL_SCOPE = "local"
_INVALID = re.compile(r"[/\\\x00-\x1f\x7f]")


class InvalidScopeId(ValueError):
    """A scope id must be 1..128 chars, without '/', '\\' or control characters, and not '.' or '..'."""


def validate_scope_id(scope_id: str) -> str:
    """Return ``scope_id`` unchanged if valid, else raise :class:`InvalidScopeId`."""
    if (
        not isinstance(scope_id, str)
        or not 1 <= len(scope_id) <= 128
        or scope_id in (".", "..")
        or _INVALID.search(scope_id)
    ):
        raise InvalidScopeId(f"invalid scope id {scope_id!r}: {InvalidScopeId.__doc__}")
    return scope_id
