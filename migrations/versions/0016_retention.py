"""retention: indexes the sweep's pruning walks, and where its embeddings walks resume

Revision ID: 0016
Revises: 0013
Create Date: 2026-12-01

- ``ix_processing_jobs_ended``: ended jobs by completion time (pruning replaced jobs, oldest first).
- ``ix_task_attempts_ended``: completed/failed attempts by last update (pruning old attempts).
- ``retention_walks``: per embeddings table, the last id the stale-embeddings walk saw.
"""

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_processing_jobs_ended', 'processing_jobs', ['completed_at'], unique=False,
                    postgresql_where=sa.text("status IN ('succeeded', 'failed', 'target_changed', 'superseded',"
                                             " 'cancelled')"))
    op.create_index('ix_task_attempts_ended', 'task_attempts', ['updated_at'], unique=False,
                    postgresql_where=sa.text("state IN ('completed', 'failed')"))
    op.create_table('retention_walks',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('after_id', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_retention_walks'))
    )


def downgrade() -> None:
    op.drop_table('retention_walks')
    op.drop_index('ix_task_attempts_ended', table_name='task_attempts')
    op.drop_index('ix_processing_jobs_ended', table_name='processing_jobs')
