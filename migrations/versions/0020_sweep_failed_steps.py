"""sweep_state.failed_steps: which steps of the last completed sweep raised

Revision ID: 0020
Revises: 0016
Create Date: 2026-12-01

Each sweep step is isolated (app/orchestrator/sweep.py): one that raises is logged and counted and
the next still runs; the sweep's record keeps ``[{step, error}]`` of those that failed.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0020'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('sweep_state', sa.Column('failed_steps', postgresql.JSONB(astext_type=sa.Text()),
                                           server_default=sa.text("'[]'::jsonb"), nullable=False))


def downgrade() -> None:
    op.drop_column('sweep_state', 'failed_steps')
