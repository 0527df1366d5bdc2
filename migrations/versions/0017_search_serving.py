"""search serving state: which model each scope's search reads, model backfills, cutover epochs

Revision ID: 0017
Revises: 0013
Create Date: 2026-12-01

- ``search_serving``: per (scope, kind) the serving model (answers every query), the target model
  being filled (state ``backfill``), the previous model (kept for a rollback), the epoch bumped by
  every switch of the reads, the fill batch and its coverage.
- ``search_serving_events``: one row per state change (bootstrap, backfill, cutover, rollback …).
- ``batches.fill_models``: a model backfill seeds only the images lacking one of these models.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0017'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('batches', sa.Column('fill_models', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.create_table('search_serving',
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('epoch', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('serving_model', sa.Text(), nullable=False),
    sa.Column('serving_dims', sa.Integer(), nullable=False),
    sa.Column('serving_ref', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('target_model', sa.Text(), nullable=True),
    sa.Column('target_dims', sa.Integer(), nullable=True),
    sa.Column('target_ref', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('previous_model', sa.Text(), nullable=True),
    sa.Column('previous_dims', sa.Integer(), nullable=True),
    sa.Column('previous_ref', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('batch_id', sa.UUID(), nullable=True),
    sa.Column('fill_rounds', sa.Integer(), server_default='0', nullable=False),
    sa.Column('ready', sa.Integer(), server_default='0', nullable=False),
    sa.Column('total', sa.Integer(), server_default='0', nullable=False),
    sa.Column('coverage_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('checked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('switched_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("kind IN ('text', 'visual')", name=op.f('ck_search_serving_kind_valid')),
    sa.CheckConstraint("state IN ('serving', 'backfill', 'pinned')", name=op.f('ck_search_serving_state_valid')),
    sa.CheckConstraint("(target_model IS NULL) = (state <> 'backfill')",
                       name=op.f('ck_search_serving_target_iff_backfill')),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_search_serving_scope_id_scopes'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('scope_id', 'kind', name=op.f('pk_search_serving')),
    )
    op.create_index('ix_search_serving_state', 'search_serving', ['state', 'kind'], unique=False)
    op.create_table('search_serving_events',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('action', sa.String(length=16), nullable=False),
    sa.Column('epoch', sa.BigInteger(), nullable=False),
    sa.Column('from_model', sa.Text(), nullable=True),
    sa.Column('to_model', sa.Text(), nullable=True),
    sa.Column('detail', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("action IN ('bootstrap', 'backfill', 'retarget', 'refill', 'cutover', 'early_cutover',"
                       " 'rollback', 'abort', 'resume')", name=op.f('ck_search_serving_events_action_valid')),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_search_serving_events_scope_id_scopes'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_search_serving_events')),
    )
    op.create_index('ix_search_serving_events_scope', 'search_serving_events', ['scope_id', 'kind', 'id'],
                    unique=False)


def downgrade() -> None:
    op.drop_index('ix_search_serving_events_scope', table_name='search_serving_events')
    op.drop_table('search_serving_events')
    op.drop_index('ix_search_serving_state', table_name='search_serving')
    op.drop_table('search_serving')
    op.drop_column('batches', 'fill_models')
