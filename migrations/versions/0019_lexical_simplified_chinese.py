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

from alembic import op

revision = '0019'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    _remake_terms()


def _remake_terms() -> None:
    from app.search.lexical_backfill import remake_image_terms

    remake_image_terms(op.get_bind())


def downgrade() -> None:
    # the terms made by this revision's code are the only ones it can make; nothing to undo
    pass
