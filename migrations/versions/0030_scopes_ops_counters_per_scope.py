"""scopes_ops_counters_per_scope: the /ops counters (fencing rejections, re-hints) are kept per scope

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07

``ops_counters`` summed every tenant's fencing rejections and re-hints into one bucket per minute,
and /ops showed that sum to whichever scope was signed in: one tenant read another's activity
(SPEC §2.6). Each bucket now belongs to a scope (``scope_id``, the task's or the webhook
subscription's); /ops reads its own scope's only. Rows from before the upgrade have no scope
(``''``) and are shown to nobody; they age out with the retention of ``ops_counters``.
"""

import sqlalchemy as sa
from alembic import op

revision = '0030'
down_revision = '0029'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('ops_counters', sa.Column('scope_id', sa.String(length=128), server_default='', nullable=False))
    op.drop_constraint('pk_ops_counters', 'ops_counters', type_='primary')
    op.create_primary_key('pk_ops_counters', 'ops_counters', ['bucket', 'name', 'scope_id'])


def downgrade() -> None:
    # each scope's bucket folds into the deployment's of the same minute and name (what 0029 counted)
    op.execute("""
INSERT INTO ops_counters (bucket, name, scope_id, count)
SELECT bucket, name, '', sum(count) FROM ops_counters WHERE scope_id <> '' GROUP BY bucket, name
ON CONFLICT (bucket, name, scope_id) DO UPDATE SET count = ops_counters.count + EXCLUDED.count""")
    op.execute("DELETE FROM ops_counters WHERE scope_id <> ''")
    op.drop_constraint('pk_ops_counters', 'ops_counters', type_='primary')
    op.drop_column('ops_counters', 'scope_id')
    op.create_primary_key('pk_ops_counters', 'ops_counters', ['bucket', 'name'])
