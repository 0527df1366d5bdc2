"""Reads for the library page (no state changes here; writes go through the API)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text

# -- recent_images: the newest images of a scope with their latest job's status (ix_images_scope_page) --
RECENT_IMAGES = text("""
    SELECT i.id, i.display_name, i.sha256, i.width, i.height, i.context_status, i.created_at,
           lj.id AS job_id, lj.status AS job_status
      FROM images i
      LEFT JOIN LATERAL (SELECT id, status FROM processing_jobs j
                          WHERE j.scope_id = i.scope_id AND j.image_id = i.id
                          ORDER BY revision DESC LIMIT 1) lj ON true
     WHERE i.scope_id = :s
       AND (CAST(:bc AS timestamptz) IS NULL OR (i.created_at, i.id) < (:bc, :bid))
     ORDER BY i.created_at DESC, i.id DESC
     LIMIT :n
""")

# the count a trigger on images keeps (scope_usage, migration 0013; search's coverage reads it): a page load never
# counts a large scope's images
COUNT_IMAGES = text("SELECT coalesce(max(image_count), 0) FROM scope_usage WHERE scope_id = :s")


def recent_images(engine: Engine, scope_id: str, limit: int = 60,
                  before: tuple[datetime, uuid.UUID] | None = None) -> tuple[list[dict[str, Any]], bool, int]:
    """(up to ``limit`` newest images older than the keyset ``before``, whether more follow, the
    scope's image count)."""
    params = {"s": scope_id, "n": limit + 1, "bc": before[0] if before else None, "bid": before[1] if before else None}
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(RECENT_IMAGES, params).mappings()]
        total = int(conn.execute(COUNT_IMAGES, {"s": scope_id}).scalar_one())
    return rows[:limit], len(rows) > limit, total
