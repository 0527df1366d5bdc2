"""drop two indexes that only cost writes and can mislead the planner

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30

``ix_processing_jobs_image (scope_id, image_id, revision)`` repeats the unique constraint on the same
columns: every job insert and (non-HOT) status update paid for a second identical entry.

``ix_text_embeddings_scope_model (scope_id, model)`` is reached through the unique index's
``scope_id`` prefix just as well, and with statistics taken while a scope was small (a fresh library
filling up) the planner chose it for the per-job "is this text embedding current?" check — which then
read every embedding of the scope, once per job. Without it that check can only use the unique
index (scope_id, image_id, image_sha256, metadata_hash, model): one row.
"""

from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index('ix_processing_jobs_image', table_name='processing_jobs')
    op.drop_index('ix_text_embeddings_scope_model', table_name='text_embeddings')


def downgrade() -> None:
    op.create_index('ix_text_embeddings_scope_model', 'text_embeddings', ['scope_id', 'model'], unique=False)
    op.create_index('ix_processing_jobs_image', 'processing_jobs', ['scope_id', 'image_id', 'revision'], unique=False)
