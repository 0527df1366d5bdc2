"""lexical search: re-make images.search_tsv with words of every script

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07

app/search/lexical.py made terms of Latin words and CJK runs only: a Cyrillic, Greek, Arabic,
Hebrew or Devanagari word, or a Thai caption, had no term, so lexical search could not find it.
Words of other alphabets are now terms (combining marks kept in the word; Greek accents, Hebrew
points and Arabic harakat left out), Thai, Lao, Khmer and Myanmar runs are bigrams like CJK, and
text is case-folded (Greek final sigma, ß). Every image's terms are re-made from its current text.
"""

from alembic import op

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    from app.search.lexical_backfill import remake_image_terms

    remake_image_terms(op.get_bind())


def downgrade() -> None:
    # the terms this revision's code makes are the only ones it can make; nothing to undo
    pass
