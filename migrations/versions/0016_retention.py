"""retention: where the sweep's pruning walks resume

Revision ID: 0016
Revises: 0013
Create Date: 2026-12-01

- ``retention_walks``: per kind of history (jobs, tasks, attempts, text/visual embeddings), the
  primary key its walk resumes after (NULL = the start).
"""

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('retention_walks',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('after_key', sa.Text(), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_retention_walks'))
    )


def downgrade() -> None:
    op.drop_table('retention_walks')
