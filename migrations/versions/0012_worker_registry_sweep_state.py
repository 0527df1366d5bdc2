"""worker registry and the last completed sweep (liveness you can see)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01

``worker_registry``: one row per live worker process (Celery node name, host, pid, the queues it
consumes, started_at, last_seen), upserted by the worker's registry thread and pruned by the sweep
once ``last_seen`` is older than the TTL. ``sweep_state``: a single row with the time and duration
of the last completed reconcile sweep and the lane gauges it computed, so ``/metrics``,
``/readyz`` and ``/ops`` read one row instead of counting the tasks table.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('worker_registry',
    sa.Column('node', sa.String(length=255), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('lanes', postgresql.ARRAY(sa.String(length=32)), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('node', name=op.f('pk_worker_registry'))
    )
    op.create_table('sweep_state',
    sa.Column('id', sa.SmallInteger(), nullable=False),
    sa.Column('last_success_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('duration_s', sa.Double(), nullable=False),
    sa.Column('lane_gauges', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"),
              nullable=False),
    sa.CheckConstraint('id = 1', name=op.f('ck_sweep_state_single_row')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sweep_state'))
    )


def downgrade() -> None:
    op.drop_table('sweep_state')
    op.drop_table('worker_registry')
