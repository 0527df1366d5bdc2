"""job and stage rows updated in place (HOT): no index on processing_jobs.updated_at, fillfactor 80

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-01

A no-op drain rewrites each job's row ~5 times and each stage's 3 times. An update is HOT (heap-only:
no index entry written, the old version pruned on the page) only when it changes no indexed column
and the new version fits on the same page. Before this revision none of the job updates was HOT:

- ``ix_processing_jobs_active (updated_at) WHERE status IN ('queued', 'running')`` was read by no
  query (the sweep, the ops pages and retention reach jobs by id, image, batch or scope), and
  every update of an active job wrote an entry into it;
- ``ix_processing_jobs_needs_human`` was keyed on ``updated_at``, which every job update sets. Its
  one reader (``app/ops/queries.py::needs_human``) filters on the scope and these statuses and
  sorts the few rows it finds, so it is now keyed on ``scope_id``;
- the pages were full (fillfactor 100). ``processing_jobs`` and ``job_stages`` now leave 20 % free.

So the two "stage linked" updates per job (current_stage, metadata_hash, updated_at) and a stage's
claim and finish (status, attempt_count, timestamps) can be HOT. ``ALTER TABLE … SET (fillfactor)``
applies to pages written from now on; existing rows stay where they are (no rewrite, no long lock).
"""

import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None

NEEDS_HUMAN = "status IN ('blocked', 'unknown_execution', 'failed')"


def upgrade() -> None:
    op.drop_index('ix_processing_jobs_active', table_name='processing_jobs')
    op.drop_index('ix_processing_jobs_needs_human', table_name='processing_jobs')
    op.create_index('ix_processing_jobs_needs_human', 'processing_jobs', ['scope_id'], unique=False,
                    postgresql_where=sa.text(NEEDS_HUMAN))
    op.execute('ALTER TABLE processing_jobs SET (fillfactor = 80)')
    op.execute('ALTER TABLE job_stages SET (fillfactor = 80)')


def downgrade() -> None:
    op.execute('ALTER TABLE job_stages RESET (fillfactor)')
    op.execute('ALTER TABLE processing_jobs RESET (fillfactor)')
    op.drop_index('ix_processing_jobs_needs_human', table_name='processing_jobs')
    op.create_index('ix_processing_jobs_needs_human', 'processing_jobs', ['updated_at'], unique=False,
                    postgresql_where=sa.text(NEEDS_HUMAN))
    op.create_index('ix_processing_jobs_active', 'processing_jobs', ['updated_at'], unique=False,
                    postgresql_where=sa.text("status IN ('queued', 'running')"))
