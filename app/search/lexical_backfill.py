"""Re-making stored lexical terms from the current code: the backfill migrations 0007, 0019 and 0024
share (app.search, not app.db: it renders terms with app/search/lexical.py)."""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.engine import Connection

_PAGE = 500


def remake_image_terms(conn: Connection, page: int = _PAGE) -> None:
    """Re-make every image's lexical terms (``images.search_tsv``) from its current display name and
    context, in pages of ``page`` images: the rendering the store writes with a context
    (app/search/lexical.py; an image with no usable context gets its display name's terms). Rows
    whose terms are already current are left alone."""
    from app.search.lexical import image_terms

    last = None
    while True:
        rows = conn.execute(
            sa.text(
                "SELECT id, display_name, context, context_status FROM images"
                " WHERE (CAST(:last AS uuid) IS NULL OR id > CAST(:last AS uuid)) ORDER BY id LIMIT :n"
            ),
            {"last": last, "n": page},
        ).all()
        if not rows:
            return
        doc = [
            {"id": str(r.id), "terms": image_terms(
                r.display_name, r.context if r.context_status in ("ready", "edited") else None)}
            for r in rows
        ]
        conn.execute(
            sa.text(
                "UPDATE images i SET search_tsv = to_tsvector('simple', r.terms)"
                " FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(id uuid, terms text)"
                " WHERE i.id = r.id AND i.search_tsv IS DISTINCT FROM to_tsvector('simple', r.terms)"
            ),
            {"rows": json.dumps(doc)},
        )
        last = str(rows[-1].id)
