"""recall_attempt_recall_safe: each agent attempt records whether its provider is recall-safe

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07

A local agent (``local-ocr``, ``deterministic``) has no external effect and no cost, so an attempt
whose worker died may simply run again; a paid remote one may not (SPEC §4.5: ``unknown_execution``).
The claim that starts an attempt records which it is, from the claiming worker's provider
(``app.stages.base.is_recall_safe``), so the lease recovery and the sweep decide from the row —
not from a setting that may have changed between the crash and the recovery, nor from a message.
Existing attempts stay ``false``: their recovery is the one they were started under.
"""

import sqlalchemy as sa
from alembic import op

revision = '0029'
down_revision = '0028'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a constant default: PostgreSQL adds the column without rewriting the table
    op.add_column("task_attempts", sa.Column("recall_safe", sa.Boolean(), nullable=False, server_default="false"))


def downgrade() -> None:
    op.drop_column("task_attempts", "recall_safe")
