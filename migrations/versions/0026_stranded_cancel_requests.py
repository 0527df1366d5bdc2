"""stranded_cancel_requests: repair tasks the old retry left queued with a cancel request

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07

Before this release a retryable failure of a task whose job had been cancelled while it ran
requeued it with ``cancel_requested`` still set. No claim takes a cancel-requested task and the
lease step looks only at running ones, yet the task stayed active for dedupe: the next job of its
image linked its stage to it and waited forever. The retry now ends such a task cancelled, or
withdraws the request when an open stage waits on it (``tasks.end_cancel_requested_txn``,
``tasks.requeue_fenced_txn``); this data migration does the same for tasks already stranded:

- an open job stage waits on it: the request is withdrawn and its hint cleared (the sweep's
  re-hint step wakes a worker), so it runs and the waiting job goes on;
- nothing waits on it: it ends ``cancelled``, as the retry now ends it.

Grants are not touched: a stranded agent task was claimed at least once, so its grant already
counts like any attempted one (``grants.release_if_unattempted_txn`` would not release it either
when it has attempts). Nothing to undo on downgrade.
"""

from alembic import op

revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None

_WAITED_ON = ("EXISTS (SELECT 1 FROM job_stages js WHERE js.task_id = tasks.id"
              " AND js.status IN ('queued', 'running'))")


def upgrade() -> None:
    op.execute("UPDATE tasks SET cancel_requested = false, last_hint_at = NULL, updated_at = now()"
               f" WHERE status = 'queued' AND cancel_requested AND {_WAITED_ON}")
    op.execute("UPDATE tasks SET status = 'cancelled', completed_at = now(), updated_at = now(),"
               " error = jsonb_build_object('code', 'cancelled', 'message',"
               " 'cancelled while it ran; its retry was left queued by an earlier release (migration 0026)')"
               f" WHERE status = 'queued' AND cancel_requested AND NOT {_WAITED_ON}")


def downgrade() -> None:
    pass
