"""lanelimit_worker_registry_agent_limits: each agent worker registers the agent lane limits it was given

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-07

The agent lane's slots are DB-wide, but how many there are was each worker's own setting
(``MEMEFLOW_AGENT_LANE_LIMIT``, ``MEMEFLOW_AGENT_RESOURCE_LIMIT``): two agent workers started with
different values made the largest one the deployment's limit, and a worker with 0 (unlimited)
skipped the slots altogether. A worker serving the agent lane now records the limits it was given
with its registration (NULL: it does not serve the agent lane, or runs an older release); every
agent worker admits claims under the most conservative of the live ones (app/orchestrator/lane_limits.py).
"""

import sqlalchemy as sa
from alembic import op

revision = '0031'
down_revision = '0030'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('worker_registry', sa.Column('agent_lane_limit', sa.Integer(), nullable=True))
    op.add_column('worker_registry', sa.Column('agent_resource_limit', sa.Integer(), nullable=True))
    op.create_check_constraint(
        op.f('ck_worker_registry_agent_limits_valid'), 'worker_registry',
        'agent_lane_limit >= 0 AND agent_resource_limit >= 0')


def downgrade() -> None:
    op.drop_constraint(op.f('ck_worker_registry_agent_limits_valid'), 'worker_registry', type_='check')
    op.drop_column('worker_registry', 'agent_resource_limit')
    op.drop_column('worker_registry', 'agent_lane_limit')
