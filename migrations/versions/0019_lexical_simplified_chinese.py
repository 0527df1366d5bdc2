"""lexical search: re-make images.search_tsv with traditional Chinese folded to simplified

Revision ID: 0019
Revises: 0013
Create Date: 2026-12-01

app/search/lexical.py now folds traditional Chinese characters to simplified (OpenCC t2s,
app/search/hanzi.py) before making terms, for documents and queries alike. Stored terms made
before would no longer meet a query's terms where a caption was read in traditional form, so
every image's terms are re-made here from its current display name and context, in pages (the
same rendering the store writes; an image with no usable context gets its display name's terms).
"""

import json

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0013'
branch_labels = None
depends_on = None

_PAGE = 500


def upgrade() -> None:
    _remake_terms()


def _remake_terms() -> None:
    from app.search.lexical import image_terms

    conn = op.get_bind()
    last = None
    while True:
        rows = conn.execute(
            sa.text(
                "SELECT id, display_name, context, context_status FROM images"
                " WHERE (CAST(:last AS uuid) IS NULL OR id > CAST(:last AS uuid)) ORDER BY id LIMIT :n"
            ),
            {"last": last, "n": _PAGE},
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


def downgrade() -> None:
    # the terms made by this revision's code are the only ones it can make; nothing to undo
    pass
