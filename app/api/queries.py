"""Read-only lookups the API needs besides the orchestrator's reads (no state changes here)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine, text


def image_file(engine: Engine, scope_id: str, image_id: uuid.UUID) -> Any | None:
    """(storage_key, media_type, sha256) of an image of this scope, or None."""
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT storage_key, media_type, sha256 FROM images WHERE scope_id = :s AND id = :id"),
            {"s": scope_id, "id": image_id},
        ).first()


