"""browser sessions: a pasted API token exchanged for a cookie (token mode, /ops only)

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-01

A row per signed-in browser. ``id_sha256`` is the sha256 of the random cookie value (the value
itself is never stored); ``token_id`` binds the session to the API token that opened it, so a
revoked token ends its sessions (the lookup joins ``api_tokens``) and a deleted one cascades.
``csrf_token`` is the per-session secret every /ops form must echo.
"""

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('browser_sessions',
    sa.Column('id_sha256', sa.String(length=64), nullable=False),
    sa.Column('token_id', sa.UUID(), nullable=False),
    sa.Column('csrf_token', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['token_id'], ['api_tokens.id'], name=op.f('fk_browser_sessions_token_id_api_tokens'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id_sha256', name=op.f('pk_browser_sessions')),
    )
    op.create_index('ix_browser_sessions_token_id', 'browser_sessions', ['token_id'])
    op.create_index('ix_browser_sessions_expires_at', 'browser_sessions', ['expires_at'])


def downgrade() -> None:
    op.drop_index('ix_browser_sessions_expires_at', table_name='browser_sessions')
    op.drop_index('ix_browser_sessions_token_id', table_name='browser_sessions')
    op.drop_table('browser_sessions')
