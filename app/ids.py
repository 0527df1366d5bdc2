"""Parsing ids that arrive as text (paths, CLI arguments, hint bodies): one parser for every surface."""

from __future__ import annotations

import uuid


def parse_uuid(value: object) -> uuid.UUID | None:
    """``value`` as a UUID (a UUID is returned as is), or None when it is not one — each caller
    decides what that means (404, a usage error, a dropped hint)."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except (TypeError, ValueError):
        return None
