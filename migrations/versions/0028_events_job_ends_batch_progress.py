"""events_job_ends_batch_progress: every terminal job status writes its event; a cancelled batch's
progress is told until final

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07

Until now only ``succeeded|failed|blocked|unknown_execution`` wrote a ``job.<status>`` event, so a
job that ended ``cancelled``, ``superseded`` or ``target_changed`` (``advance.end_job_txn``) was
never told: a client following it by the stream or a webhook waited for ever. The trigger on
``processing_jobs`` now fires for every terminal status (the same function, in the same
transaction as the change), and ``events.type`` accepts ``job.cancelled``, ``job.superseded`` and
``job.target_changed``. A webhook subscription that asked for every type there was (the default,
which stores the list) gets the three new ones too.

``batches.progress_open``: a cancelled batch whose items may still follow an active job (one its
cancel left running: an upload's job the batch adopted, or one another batch follows). Its counts
change after the cancel's last ``batch.progress``; the sweep tells them again
(``ix_batches_progress_open``, least recently touched first) and closes it once no item job is
active, so a batch's last event always carries its final counts. Cancelled batches with an active
item job at upgrade are opened.
"""

import sqlalchemy as sa
from alembic import op

revision = '0028'
down_revision = '0027'
branch_labels = None
depends_on = None

_OLD_TYPES = ('job.succeeded', 'job.failed', 'job.blocked', 'job.unknown_execution', 'image.deleted',
              'batch.progress', 'batch.completed', 'batch.cancelled')
_NEW_TYPES = ('job.cancelled', 'job.superseded', 'job.target_changed')
_OLD_STATUSES = ('succeeded', 'failed', 'blocked', 'unknown_execution')
_NEW_STATUSES = ('cancelled', 'superseded', 'target_changed')


def _list(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _job_trigger(statuses: tuple[str, ...]) -> None:
    op.execute('DROP TRIGGER IF EXISTS processing_jobs_events ON processing_jobs')
    op.execute(f"""
CREATE TRIGGER processing_jobs_events AFTER UPDATE OF status ON processing_jobs FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN ({_list(statuses)}))
  EXECUTE FUNCTION memeflow_event_job()""")


def _type_check(types: tuple[str, ...]) -> None:
    op.execute('ALTER TABLE events DROP CONSTRAINT IF EXISTS ck_events_type_valid')
    op.execute(f'ALTER TABLE events ADD CONSTRAINT ck_events_type_valid CHECK (type IN ({_list(types)}))')


def upgrade() -> None:
    _type_check(_OLD_TYPES[:4] + _NEW_TYPES + _OLD_TYPES[4:])
    _job_trigger(_OLD_STATUSES + _NEW_STATUSES)
    # "every type" stored as the list it was: it means every type, the new ones included
    op.execute(f"""
UPDATE webhook_subscriptions SET event_types = event_types || CAST(ARRAY[{_list(_NEW_TYPES)}] AS varchar(40)[])
WHERE event_types @> CAST(ARRAY[{_list(_OLD_TYPES)}] AS varchar(40)[])
  AND NOT event_types && CAST(ARRAY[{_list(_NEW_TYPES)}] AS varchar(40)[])""")
    op.add_column('batches', sa.Column('progress_open', sa.Boolean(), server_default=sa.text('false'),
                                       nullable=False))
    op.create_check_constraint(op.f('ck_batches_progress_open_cancelled'), 'batches',
                               "NOT progress_open OR status = 'cancelled'")
    op.create_index('ix_batches_progress_open', 'batches', ['updated_at'], unique=False,
                    postgresql_where=sa.text('progress_open'))
    op.execute("""
UPDATE batches b SET progress_open = true WHERE b.status = 'cancelled' AND EXISTS (
  SELECT 1 FROM batch_items bi JOIN processing_jobs j ON j.id = bi.job_id
  WHERE bi.batch_id = b.id AND j.status IN ('queued', 'running'))""")


def downgrade() -> None:
    op.drop_index('ix_batches_progress_open', table_name='batches')
    op.drop_constraint(op.f('ck_batches_progress_open_cancelled'), 'batches', type_='check')
    op.drop_column('batches', 'progress_open')
    op.execute(f"""
UPDATE webhook_subscriptions SET event_types = ARRAY(
  SELECT t FROM unnest(event_types) AS t WHERE t NOT IN ({_list(_NEW_TYPES)}))
WHERE event_types && CAST(ARRAY[{_list(_NEW_TYPES)}] AS varchar(40)[])""")
    op.execute(f'DELETE FROM events WHERE type IN ({_list(_NEW_TYPES)})')
    _job_trigger(_OLD_STATUSES)
    _type_check(_OLD_TYPES)
