"""app_secrets (the generated cursor HMAC key) and optional API token expiry

Revision ID: 0011
Revises: 0009
Create Date: 2026-12-01

``app_secrets`` holds deployment-wide random secrets generated once (insert-if-absent, so API
processes starting together agree on one value); the first is the keyset-cursor HMAC key, which
was derived from the database URL before. ``api_tokens.expires_at`` (NULL = never) lets
``memeflow tokens create --expires-in 30d`` issue tokens that stop working on their own.
"""

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'app_secrets',
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('value', sa.LargeBinary(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint('length(value) >= 32', name=op.f('ck_app_secrets_value_long_enough')),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_app_secrets')),
    )
    op.add_column('api_tokens', sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column('api_tokens', 'expires_at')
    op.drop_table('app_secrets')
