"""index job_stages by task; batched-claim index in claim order

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

Claims and completions find the stage(s) waiting on a task by ``job_stages.task_id``; without
this index each of them scanned the whole table (claim latency grew linearly with the backlog:
6 ms at 10k queued tasks, 200 ms at 1M — bench/claim_latency.py). The batched claim orders
by (priority DESC, available_at), so its index now has that order instead of sorting the lane.
The sweep's stuck-job repair is driven by recently finished tasks (ix_tasks_finished) instead of
scanning every active job.
"""

from alembic import op
import sqlalchemy as sa

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        'ix_tasks_finished', 'tasks', ['completed_at'], unique=False,
        postgresql_where=sa.text("status IN ('succeeded', 'failed', 'cancelled')"),
    )
    op.drop_index('ix_tasks_queued_due', table_name='tasks', postgresql_where=sa.text("status = 'queued'"))
    op.create_index(
        'ix_tasks_queued_due', 'tasks', ['lane', sa.text('priority DESC'), 'available_at'], unique=False,
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.create_index(
        'ix_job_stages_task', 'job_stages', ['task_id'], unique=False,
        postgresql_where=sa.text('task_id IS NOT NULL'),
    )


def downgrade() -> None:
    op.drop_index('ix_tasks_finished', table_name='tasks',
                  postgresql_where=sa.text("status IN ('succeeded', 'failed', 'cancelled')"))
    op.drop_index('ix_tasks_queued_due', table_name='tasks', postgresql_where=sa.text("status = 'queued'"))
    op.create_index(
        'ix_tasks_queued_due', 'tasks', ['lane', 'available_at'], unique=False,
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.drop_index('ix_job_stages_task', table_name='job_stages', postgresql_where=sa.text('task_id IS NOT NULL'))
