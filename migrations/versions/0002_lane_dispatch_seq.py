"""lane dispatch sequence

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

A global, monotonic dispatch counter for round-robin fairness across scopes in a lane
(lane_fairness.last_dispatch_seq takes the next value on every claim). A SEQUENCE never
blocks concurrent claimers, unlike a max()+1 over the table.
"""

from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute('CREATE SEQUENCE IF NOT EXISTS lane_dispatch_seq AS bigint START 1')


def downgrade() -> None:
    op.execute('DROP SEQUENCE IF EXISTS lane_dispatch_seq')
