"""tenant limits and fairness: per-scope quotas and rate windows, fair batched claims and seeding

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01

- ``scope_limits``: per-scope overrides of the global ``MEMEFLOW_*`` limits (NULL = the global
  value; 0 = unlimited).
- ``scope_usage``: each scope's image count and stored bytes, kept by a trigger on ``images``
  (every insert, delete — cascades included — and size change), backfilled here. An upload under
  a quota locks its scope's row, so concurrent uploads are decided one after the other.
- ``rate_windows``: fixed one-minute windows, one row per (kind, key); one upsert counts a request.
- ``ix_tasks_lane_scope_due``: the batched lanes' fair claim (loose scan over waiting scopes, each
  scope's best due tasks) and the per-scope queued backlog of batch seeding.
- ``ix_batches_seeding``: each scope's least recently touched seeding batch.
"""

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

_USAGE_FN = """
CREATE FUNCTION memeflow_scope_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP IN ('INSERT', 'UPDATE') THEN
    INSERT INTO scope_usage (scope_id, image_count, stored_bytes)
    VALUES (NEW.scope_id, CASE WHEN TG_OP = 'INSERT' THEN 1 ELSE 0 END, NEW.size_bytes)
    ON CONFLICT (scope_id) DO UPDATE SET image_count = scope_usage.image_count + excluded.image_count,
      stored_bytes = scope_usage.stored_bytes + excluded.stored_bytes;
  END IF;
  IF TG_OP IN ('DELETE', 'UPDATE') THEN
    UPDATE scope_usage SET image_count = image_count - CASE WHEN TG_OP = 'DELETE' THEN 1 ELSE 0 END,
      stored_bytes = stored_bytes - OLD.size_bytes WHERE scope_id = OLD.scope_id;
  END IF;
  RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.create_table('scope_limits',
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('max_bytes', sa.BigInteger(), nullable=True),
    sa.Column('max_images', sa.Integer(), nullable=True),
    sa.Column('uploads_per_minute', sa.Integer(), nullable=True),
    sa.Column('processing_per_minute', sa.Integer(), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('coalesce(max_bytes, 0) >= 0 AND coalesce(max_images, 0) >= 0'
                       ' AND coalesce(uploads_per_minute, 0) >= 0 AND coalesce(processing_per_minute, 0) >= 0',
                       name=op.f('ck_scope_limits_limits_valid')),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_scope_limits_scope_id_scopes'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('scope_id', name=op.f('pk_scope_limits')),
    )
    op.create_table('scope_usage',
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('image_count', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('stored_bytes', sa.BigInteger(), server_default='0', nullable=False),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_scope_usage_scope_id_scopes'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('scope_id', name=op.f('pk_scope_usage')),
    )
    op.create_table('rate_windows',
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('key', sa.Text(), nullable=False),
    sa.Column('window_start', sa.DateTime(timezone=True), nullable=False),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('kind', 'key', name=op.f('pk_rate_windows')),
    )
    op.execute(
        "INSERT INTO scope_usage (scope_id, image_count, stored_bytes)"
        " SELECT scope_id, count(*), coalesce(sum(size_bytes), 0) FROM images GROUP BY scope_id"
    )
    op.execute(_USAGE_FN)
    op.execute(
        "CREATE TRIGGER images_scope_usage AFTER INSERT OR DELETE OR UPDATE OF size_bytes ON images"
        " FOR EACH ROW EXECUTE FUNCTION memeflow_scope_usage()"
    )
    op.create_index('ix_tasks_lane_scope_due', 'tasks',
                    ['lane', 'scope_id', sa.text('priority DESC'), 'available_at'], unique=False,
                    postgresql_where=sa.text("status = 'queued'"))
    op.create_index('ix_batches_seeding', 'batches', ['scope_id', 'updated_at'], unique=False,
                    postgresql_where=sa.text("status = 'seeding'"))


def downgrade() -> None:
    op.drop_index('ix_batches_seeding', table_name='batches', postgresql_where=sa.text("status = 'seeding'"))
    op.drop_index('ix_tasks_lane_scope_due', table_name='tasks', postgresql_where=sa.text("status = 'queued'"))
    op.execute("DROP TRIGGER images_scope_usage ON images")
    op.execute("DROP FUNCTION memeflow_scope_usage()")
    op.drop_table('rate_windows')
    op.drop_table('scope_usage')
    op.drop_table('scope_limits')
