"""wake-up groups: one hint wakes the tasks created together

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

A batched completion creates the next tasks of several jobs in one statement and publishes one
hint per group of them (at most the next lane's batch size, one scope and resource key); the
others carry the hinted task's id in ``hint_group``, and a claim for that hint takes them too.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('tasks', sa.Column('hint_group', postgresql.UUID(as_uuid=True), nullable=True))
    op.create_index(
        'ix_tasks_hint_group', 'tasks', ['hint_group'], unique=False,
        postgresql_where=sa.text("status = 'queued' AND hint_group IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index('ix_tasks_hint_group', table_name='tasks',
                  postgresql_where=sa.text("status = 'queued' AND hint_group IS NOT NULL"))
    op.drop_column('tasks', 'hint_group')
