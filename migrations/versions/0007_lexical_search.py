"""lexical search: images.search_tsv (CJK-aware terms of the current text) and its GIN index

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

The terms are made in Python (app/search/lexical.py: Snowball English stems, CJK character
bigrams) and stored as a ``simple`` tsvector, written by the same statement that writes the
image's display name and context. ``btree_gin`` lets one GIN index lead with ``scope_id``, so a
term lookup never reads another scope's postings. Existing images are backfilled here, in pages.
"""

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute('CREATE EXTENSION IF NOT EXISTS btree_gin')
    op.add_column('images', sa.Column('search_tsv', sa.dialects.postgresql.TSVECTOR(), nullable=False,
                                      server_default=sa.text("''::tsvector")))
    _backfill()
    op.create_index('ix_images_search_tsv', 'images', ['scope_id', 'search_tsv'], postgresql_using='gin')


def _backfill() -> None:
    from app.search.lexical_backfill import remake_image_terms

    remake_image_terms(op.get_bind())


def downgrade() -> None:
    op.drop_index('ix_images_search_tsv', table_name='images')
    op.drop_column('images', 'search_tsv')
