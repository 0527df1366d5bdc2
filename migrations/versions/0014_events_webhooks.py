"""events: a transactional outbox, its live streams, and webhook subscriptions

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01

- ``events``: client-visible changes (``job.succeeded|failed|blocked|unknown_execution``,
  ``image.deleted``, ``batch.progress|completed|cancelled``). Triggers on ``processing_jobs``,
  ``images`` and ``batches`` stage a row in ``event_pending`` in the transaction of the change;
  a deferred constraint trigger moves the transaction's staged rows into ``events`` at commit,
  taking each touched scope's advisory lock (in key order: no deadlock between transactions
  that touch several scopes) and drawing ids from ``events_id_seq`` under it. So within a scope
  ids are drawn in commit order: a reader that has seen id N never later sees a new id < N of
  that scope, and a rolled-back change leaves no event.
- ``event_stream_slots``: leases of live streams, bounded per scope.
- ``webhook_subscriptions`` (cursor, lease, fencing token) and ``webhook_failures``.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0014'
down_revision = '0019'
branch_labels = None
depends_on = None

EVENT_TYPES = ("'job.succeeded', 'job.failed', 'job.blocked', 'job.unknown_execution', 'image.deleted', "
               "'batch.progress', 'batch.completed', 'batch.cancelled'")

_FUNCTIONS = """
CREATE FUNCTION memeflow_event_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO event_pending (scope_id, type, job_id, image_id, batch_id, payload)
  VALUES (NEW.scope_id, 'job.' || NEW.status, NEW.id, NEW.image_id, NEW.batch_id, jsonb_build_object(
    'job_id', NEW.id, 'image_id', NEW.image_id, 'batch_id', NEW.batch_id, 'status', NEW.status,
    'revision', NEW.revision, 'mode', NEW.mode, 'current_stage', NEW.current_stage, 'error', NEW.error,
    'retry_at', NEW.retry_at, 'completed_at', NEW.completed_at));
  RETURN NULL;
END $$;

CREATE FUNCTION memeflow_event_image_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO event_pending (scope_id, type, image_id, payload)
  VALUES (OLD.scope_id, 'image.deleted', OLD.id, jsonb_build_object(
    'image_id', OLD.id, 'sha256', OLD.sha256, 'display_name', OLD.display_name));
  RETURN NULL;
END $$;

CREATE FUNCTION memeflow_event_batch() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE counts jsonb;
BEGIN
  SELECT coalesce(jsonb_object_agg(status, n), '{}'::jsonb) INTO counts FROM (
    SELECT j.status, count(*) AS n FROM batch_items bi JOIN processing_jobs j ON j.id = bi.job_id
    WHERE bi.batch_id = NEW.id GROUP BY j.status) c;
  INSERT INTO event_pending (scope_id, type, batch_id, payload)
  VALUES (NEW.scope_id, 'batch.' || NEW.status, NEW.id, jsonb_build_object(
    'batch_id', NEW.id, 'status', NEW.status, 'total', NEW.total, 'counts', counts,
    'completed_at', NEW.completed_at));
  RETURN NULL;
END $$;

-- At commit: lock the scopes this transaction staged events for (in key order), then give each
-- staged event its id, in staging order. The first invocation moves them all; later ones of the
-- same transaction find nothing.
CREATE FUNCTION memeflow_events_flush() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE k bigint; r record; me bigint := txid_current();
BEGIN
  FOR k IN SELECT DISTINCT hashtextextended('memeflow.events:' || scope_id, 0) AS h
           FROM event_pending WHERE txid = me ORDER BY h LOOP
    PERFORM pg_advisory_xact_lock(k);
  END LOOP;
  FOR r IN SELECT * FROM event_pending p WHERE p.txid = me ORDER BY p.pk LOOP
    INSERT INTO events (id, scope_id, type, job_id, image_id, batch_id, payload, created_at)
    SELECT nextval('events_id_seq'), r.scope_id, r.type, r.job_id, r.image_id, r.batch_id, r.payload,
           clock_timestamp()
    WHERE EXISTS (SELECT 1 FROM scopes s WHERE s.id = r.scope_id);  -- a scope deleted in this txn: none
  END LOOP;
  DELETE FROM event_pending WHERE txid = me;
  RETURN NULL;
END $$;
"""

_TRIGGERS = """
CREATE TRIGGER processing_jobs_events AFTER UPDATE OF status ON processing_jobs FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status
        AND NEW.status IN ('succeeded', 'failed', 'blocked', 'unknown_execution'))
  EXECUTE FUNCTION memeflow_event_job();
CREATE TRIGGER images_events AFTER DELETE ON images FOR EACH ROW EXECUTE FUNCTION memeflow_event_image_deleted();
CREATE TRIGGER batches_events AFTER UPDATE OF status ON batches FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN ('completed', 'cancelled'))
  EXECUTE FUNCTION memeflow_event_batch();
CREATE CONSTRAINT TRIGGER event_pending_flush AFTER INSERT ON event_pending
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION memeflow_events_flush();
"""


def upgrade() -> None:
    op.execute('CREATE SEQUENCE IF NOT EXISTS events_id_seq AS bigint START 1')
    op.create_table('events',
    sa.Column('id', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('type', sa.String(length=40), nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=True),
    sa.Column('image_id', sa.UUID(), nullable=True),
    sa.Column('batch_id', sa.UUID(), nullable=True),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"),
              nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint(f'type IN ({EVENT_TYPES})', name=op.f('ck_events_type_valid')),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_events_scope_id_scopes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events')),
    )
    op.create_index('ix_events_scope_id', 'events', ['scope_id', 'id'], unique=False)
    op.create_index('ix_events_batch', 'events', ['batch_id', 'id'], unique=False,
                    postgresql_where=sa.text('batch_id IS NOT NULL'))
    op.create_table('event_pending',
    sa.Column('pk', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('txid', sa.BigInteger(), server_default=sa.text('txid_current()'), nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('type', sa.String(length=40), nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=True),
    sa.Column('image_id', sa.UUID(), nullable=True),
    sa.Column('batch_id', sa.UUID(), nullable=True),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"),
              nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('pk', name=op.f('pk_event_pending')),
    )
    op.create_index('ix_event_pending_txid', 'event_pending', ['txid'], unique=False)
    op.create_table('event_stream_slots',
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('slot_no', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('holder', sa.String(length=64), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_event_stream_slots_scope_id_scopes'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('scope_id', 'slot_no', name=op.f('pk_event_stream_slots')),
    )
    op.create_table('webhook_subscriptions',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('event_types', postgresql.ARRAY(sa.String(length=40)), nullable=False),
    sa.Column('secret', sa.String(length=128), nullable=False),
    sa.Column('cursor', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('attempts', sa.Integer(), server_default='0', nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('lease_owner', sa.String(length=255), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('claim_generation', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('last_hint_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('delivered_count', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('failed_count', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('last_error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('last_delivery_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_webhook_subscriptions_scope_id_scopes'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_subscriptions')),
    sa.UniqueConstraint('scope_id', 'id', name=op.f('uq_webhook_subscriptions_scope_id_id')),
    )
    op.create_index('ix_webhook_subscriptions_scope_id', 'webhook_subscriptions', ['scope_id'], unique=False)
    op.create_table('webhook_failures',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('subscription_id', sa.UUID(), nullable=False),
    sa.Column('event_id', sa.BigInteger(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('failed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['scope_id', 'subscription_id'], ['webhook_subscriptions.scope_id',
                            'webhook_subscriptions.id'],
                            name=op.f('fk_webhook_failures_scope_id_webhook_subscriptions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_failures')),
    )
    op.create_index('ix_webhook_failures_failed_at', 'webhook_failures', ['failed_at'], unique=False)
    op.execute(_FUNCTIONS)
    op.execute(_TRIGGERS)


def downgrade() -> None:
    op.execute('DROP TRIGGER IF EXISTS batches_events ON batches')
    op.execute('DROP TRIGGER IF EXISTS images_events ON images')
    op.execute('DROP TRIGGER IF EXISTS processing_jobs_events ON processing_jobs')
    op.drop_table('webhook_failures')
    op.drop_table('webhook_subscriptions')
    op.drop_table('event_stream_slots')
    op.drop_table('event_pending')
    op.drop_table('events')
    for fn in ('memeflow_events_flush', 'memeflow_event_batch', 'memeflow_event_image_deleted', 'memeflow_event_job'):
        op.execute(f'DROP FUNCTION IF EXISTS {fn}()')
    op.execute('DROP SEQUENCE IF EXISTS events_id_seq')
