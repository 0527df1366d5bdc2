"""event_prune_marks: how far retention has pruned each scope's events

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07

The sweep deletes events older than ``MEMEFLOW_EVENTS_RETENTION_S``. A webhook subscription that
had not delivered them is told (``events_expired``), but a stream client resuming from a cursor
the prune has passed (``GET /api/v1/events?after=N``, or ``Last-Event-ID``) got the next kept
events as if nothing were missing. The prune now records, per scope, the highest id it deleted
(in the same statement), so a read from a cursor below it says that events may be missing.
"""

import sqlalchemy as sa
from alembic import op

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('event_prune_marks',
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('pruned_through', sa.BigInteger(), nullable=False),
    sa.Column('pruned_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_event_prune_marks_scope_id_scopes'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('scope_id', name=op.f('pk_event_prune_marks')),
    )


def downgrade() -> None:
    op.drop_table('event_prune_marks')
