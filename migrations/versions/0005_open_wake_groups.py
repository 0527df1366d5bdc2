"""open wake-up groups: a new task of a batched lane joins the newest queued group

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

A task created on its own (an upload, one job's next stage) in the ``visual`` or ``embedding`` lane
joins the newest still-queued, never-claimed group of its scope, lane, resource key and priority
while that group has room, instead of publishing a hint of its own. ``hint_members`` counts a group's
members on its named task (the cap); the partial index finds the newest group in one step.
"""

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

_OPEN = "status = 'queued' AND hint_group IS NULL"


def upgrade() -> None:
    op.add_column('tasks', sa.Column('hint_members', sa.Integer(), server_default='0', nullable=False))
    op.create_index(
        'ix_tasks_open_group', 'tasks', ['scope_id', 'lane', 'resource_key', 'priority', 'created_at'], unique=False,
        postgresql_where=sa.text(_OPEN),
    )


def downgrade() -> None:
    op.drop_index('ix_tasks_open_group', table_name='tasks', postgresql_where=sa.text(_OPEN))
    op.drop_column('tasks', 'hint_members')
