"""tasks.claimed_alone: whether a task's current execution was claimed in a batch of one

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-01

A batched lane (visual, embedding) runs up to N tasks, of several scopes, in one worker process. A
poisoned input that kills the process (a decoder or model segfault, an OOM) left every task of its
batch with an expired lease, each charged an attempt; re-claimed with a fresh fair fill, it killed
the next batch too, until other scopes' tasks were failed ``max_attempts_exceeded`` (SPEC §10: one
item's failure never fails, charges or annotates another item of its batch).

Each claim now records whether it took the task alone. A task whose lease lapsed is claimed again
alone (no group, no fill), and if the run that died was not alone its attempt is refunded: only a
death in a run of its own is charged, and the sweep ends only such a task ``max_attempts_exceeded``.
Existing rows read ``true`` (charged, as before); a constant default adds the column without a
table rewrite.
"""

import sqlalchemy as sa
from alembic import op

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('tasks', sa.Column('claimed_alone', sa.Boolean(), server_default=sa.text('true'), nullable=False))


def downgrade() -> None:
    op.drop_column('tasks', 'claimed_alone')
