"""search_serving: a grace period for configuration disagreements, and a fair sweep round-robin

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-08

- ``config_disagree_since`` / ``config_disagree_ref``: since when sweeps have been configured with a
  model (``{"model", "dims", "preprocess_version"}``) other than the row's current direction (the
  serving model, or the target during a backfill). A sweep acts on it (begins a backfill, aborts,
  retargets) only once it has lasted ``MEMEFLOW_SEARCH_CONFIG_GRACE_S``; a sweep that agrees clears
  it. During a rolling restart old- and new-configuration sweeps no longer undo each other.
- ``attended_at``: when a sweep last looked at the row. The sweep takes the least recently attended
  rows first; ordering by ``checked_at`` (set only by a coverage check, refused while a fill batch is
  seeding) let the same scopes take every turn.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('search_serving', sa.Column('config_disagree_since', sa.DateTime(timezone=True), nullable=True))
    op.add_column('search_serving', sa.Column('config_disagree_ref', postgresql.JSONB(astext_type=sa.Text()),
                                              nullable=True))
    op.add_column('search_serving', sa.Column('attended_at', sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(op.f('ck_search_serving_config_disagree_both'), 'search_serving',
                               '(config_disagree_since IS NULL) = (config_disagree_ref IS NULL)')


def downgrade() -> None:
    op.drop_constraint(op.f('ck_search_serving_config_disagree_both'), 'search_serving', type_='check')
    op.drop_column('search_serving', 'attended_at')
    op.drop_column('search_serving', 'config_disagree_ref')
    op.drop_column('search_serving', 'config_disagree_since')
