"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-30

The whole schema of SPEC §3. Per-model HNSW indexes are created at run time by
app.db.engine.ensure_vector_index (one partial expression index per model and dims).
"""

from alembic import op
import sqlalchemy as sa
import pgvector.sqlalchemy
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute('CREATE EXTENSION IF NOT EXISTS vector')
    op.create_table('ops_counters',
    sa.Column('bucket', sa.DateTime(timezone=True), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('count', sa.BigInteger(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('bucket', 'name', name=op.f('pk_ops_counters'))
    )
    op.create_table('scopes',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('storage_namespace', sa.UUID(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("id ~ '^[^/\\\\\\x01-\\x1f\\x7f]{1,128}$' AND id NOT IN ('.', '..')", name=op.f('ck_scopes_id_valid')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_scopes')),
    sa.UniqueConstraint('storage_namespace', name=op.f('uq_scopes_storage_namespace'))
    )
    op.create_table('api_tokens',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('token_sha256', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_api_tokens_scope_id_scopes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('scope_id', 'name', name=op.f('uq_api_tokens_scope_id_name')),
    sa.UniqueConstraint('token_sha256', name=op.f('uq_api_tokens_token_sha256'))
    )
    op.create_table('batches',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('status', sa.String(length=16), server_default='seeding', nullable=False),
    sa.Column('select_all', sa.Boolean(), nullable=False),
    sa.Column('requested_ids', postgresql.ARRAY(sa.UUID()), nullable=True),
    sa.Column('reverse_image_policy', sa.String(length=8), nullable=False),
    sa.Column('seed_cursor', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('total', sa.Integer(), server_default='0', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("reverse_image_policy IN ('forbid', 'auto')", name=op.f('ck_batches_reverse_image_policy_valid')),
    sa.CheckConstraint("status IN ('seeding', 'running', 'completed', 'cancelled')", name=op.f('ck_batches_status_valid')),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_batches_scope_id_scopes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_batches')),
    sa.UniqueConstraint('scope_id', 'id', name=op.f('uq_batches_scope_id_id'))
    )
    op.create_index('ix_batches_active', 'batches', ['updated_at'], unique=False, postgresql_where=sa.text("status IN ('seeding', 'running')"))
    op.create_table('images',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('extension', sa.String(length=8), nullable=False),
    sa.Column('media_type', sa.String(length=40), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('width', sa.Integer(), nullable=False),
    sa.Column('height', sa.Integer(), nullable=False),
    sa.Column('storage_key', sa.Text(), nullable=False),
    sa.Column('display_name', sa.Text(), nullable=True),
    sa.Column('context', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('context_status', sa.String(length=16), server_default='pending', nullable=False),
    sa.Column('context_provenance', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('metadata_hash', sa.String(length=64), nullable=True),
    sa.Column('revision', sa.Integer(), server_default='1', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("context_status IN ('pending', 'ready', 'edited')", name=op.f('ck_images_context_status_valid')),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_images_scope_id_scopes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_images')),
    sa.UniqueConstraint('scope_id', 'id', name=op.f('uq_images_scope_id_id')),
    sa.UniqueConstraint('scope_id', 'sha256', name=op.f('uq_images_scope_id_sha256'))
    )
    op.create_index('ix_images_scope_page', 'images', ['scope_id', 'created_at', 'id'], unique=False)
    op.create_table('lane_fairness',
    sa.Column('lane', sa.String(length=16), nullable=False),
    sa.Column('resource_key', sa.Text(), nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('last_dispatch_seq', sa.BigInteger(), server_default='0', nullable=False),
    sa.CheckConstraint("lane IN ('visual', 'agent', 'embedding')", name=op.f('ck_lane_fairness_lane_valid')),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_lane_fairness_scope_id_scopes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('lane', 'resource_key', 'scope_id', name=op.f('pk_lane_fairness'))
    )
    op.create_table('operation_grants',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('operation', sa.String(length=64), nullable=False),
    sa.Column('idempotency_key', sa.String(length=128), nullable=False),
    sa.Column('task_id', sa.UUID(), nullable=True),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('retry_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("state IN ('acquired', 'committed', 'released', 'unknown')", name=op.f('ck_operation_grants_state_valid')),
    sa.ForeignKeyConstraint(['scope_id'], ['scopes.id'], name=op.f('fk_operation_grants_scope_id_scopes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_operation_grants')),
    sa.UniqueConstraint('scope_id', 'operation', 'idempotency_key', name=op.f('uq_operation_grants_scope_id_operation_idempotency_key'))
    )
    op.create_index('ix_operation_grants_usage', 'operation_grants', ['scope_id', 'operation', 'created_at'], unique=False)
    op.create_table('processing_jobs',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('image_id', sa.UUID(), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('image_sha256', sa.String(length=64), nullable=False),
    sa.Column('metadata_hash', sa.String(length=64), nullable=True),
    sa.Column('config', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('config_hash', sa.String(length=64), nullable=False),
    sa.Column('reverse_image_policy', sa.String(length=8), nullable=False),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('force_stages', postgresql.ARRAY(sa.Text()), server_default='{}', nullable=False),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('current_stage', sa.String(length=24), nullable=True),
    sa.Column('error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('retry_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('batch_id', sa.UUID(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("current_stage IS NULL OR current_stage IN ('visual', 'agent', 'text_embedding')", name=op.f('ck_processing_jobs_current_stage_valid')),
    sa.CheckConstraint("mode IN ('auto', 'explicit', 'full_retry')", name=op.f('ck_processing_jobs_mode_valid')),
    sa.CheckConstraint("reverse_image_policy IN ('forbid', 'auto')", name=op.f('ck_processing_jobs_reverse_image_policy_valid')),
    sa.CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed', 'blocked', 'unknown_execution', 'target_changed', 'superseded', 'cancelled')", name=op.f('ck_processing_jobs_status_valid')),
    sa.ForeignKeyConstraint(['scope_id', 'batch_id'], ['batches.scope_id', 'batches.id'], name=op.f('fk_processing_jobs_scope_id_batch_id_batches')),
    sa.ForeignKeyConstraint(['scope_id', 'image_id'], ['images.scope_id', 'images.id'], name=op.f('fk_processing_jobs_scope_id_image_id_images'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_processing_jobs')),
    sa.UniqueConstraint('scope_id', 'id', name=op.f('uq_processing_jobs_scope_id_id')),
    sa.UniqueConstraint('scope_id', 'image_id', 'revision', name=op.f('uq_processing_jobs_scope_id_image_id_revision'))
    )
    op.create_index('ix_processing_jobs_active', 'processing_jobs', ['updated_at'], unique=False, postgresql_where=sa.text("status IN ('queued', 'running')"))
    op.create_index('ix_processing_jobs_batch', 'processing_jobs', ['batch_id', 'status'], unique=False, postgresql_where=sa.text('batch_id IS NOT NULL'))
    op.create_index('ix_processing_jobs_image', 'processing_jobs', ['scope_id', 'image_id', 'revision'], unique=False)
    op.create_index('ix_processing_jobs_needs_human', 'processing_jobs', ['updated_at'], unique=False, postgresql_where=sa.text("status IN ('blocked', 'unknown_execution', 'failed')"))
    op.create_index('ix_processing_jobs_scope_page', 'processing_jobs', ['scope_id', 'created_at', 'id'], unique=False)
    op.create_index('uq_processing_jobs_one_active_per_image', 'processing_jobs', ['image_id'], unique=True, postgresql_where=sa.text("status IN ('queued', 'running')"))
    op.create_table('text_embeddings',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('image_id', sa.UUID(), nullable=False),
    sa.Column('image_sha256', sa.String(length=64), nullable=False),
    sa.Column('metadata_hash', sa.String(length=64), nullable=False),
    sa.Column('model', sa.Text(), nullable=False),
    sa.Column('dims', sa.Integer(), nullable=False),
    sa.Column('document_version', sa.String(length=32), nullable=False),
    sa.Column('document', sa.Text(), nullable=False),
    sa.Column('embedding', pgvector.sqlalchemy.vector.VECTOR(), nullable=False),
    sa.Column('status', sa.String(length=16), server_default='ready', nullable=False),
    sa.Column('task_id', sa.UUID(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("status IN ('ready')", name=op.f('ck_text_embeddings_status_valid')),
    sa.CheckConstraint('dims > 0 AND vector_dims(embedding) = dims', name=op.f('ck_text_embeddings_dims_match')),
    sa.ForeignKeyConstraint(['scope_id', 'image_id'], ['images.scope_id', 'images.id'], name=op.f('fk_text_embeddings_scope_id_image_id_images'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_text_embeddings')),
    sa.UniqueConstraint('scope_id', 'image_id', 'image_sha256', 'metadata_hash', 'model', name=op.f('uq_text_embeddings_scope_id_image_id_image_sha256_metadata_hash_model'))
    )
    op.create_index('ix_text_embeddings_scope_model', 'text_embeddings', ['scope_id', 'model'], unique=False)
    op.create_table('visual_embeddings',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('image_id', sa.UUID(), nullable=False),
    sa.Column('image_sha256', sa.String(length=64), nullable=False),
    sa.Column('model', sa.Text(), nullable=False),
    sa.Column('preprocess_version', sa.Text(), nullable=False),
    sa.Column('dims', sa.Integer(), nullable=False),
    sa.Column('embedding', pgvector.sqlalchemy.vector.VECTOR(), nullable=False),
    sa.Column('task_id', sa.UUID(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('dims > 0 AND vector_dims(embedding) = dims', name=op.f('ck_visual_embeddings_dims_match')),
    sa.ForeignKeyConstraint(['scope_id', 'image_id'], ['images.scope_id', 'images.id'], name=op.f('fk_visual_embeddings_scope_id_image_id_images'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_visual_embeddings')),
    sa.UniqueConstraint('scope_id', 'image_id', 'model', 'preprocess_version', 'image_sha256', name=op.f('uq_visual_embeddings_scope_id_image_id_model_preprocess_version_image_sha256'))
    )
    op.create_table('batch_items',
    sa.Column('batch_id', sa.UUID(), nullable=False),
    sa.Column('image_id', sa.UUID(), nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['scope_id', 'batch_id'], ['batches.scope_id', 'batches.id'], name=op.f('fk_batch_items_scope_id_batch_id_batches'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['scope_id', 'image_id'], ['images.scope_id', 'images.id'], name=op.f('fk_batch_items_scope_id_image_id_images'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['scope_id', 'job_id'], ['processing_jobs.scope_id', 'processing_jobs.id'], name=op.f('fk_batch_items_scope_id_job_id_processing_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('batch_id', 'image_id', name=op.f('pk_batch_items'))
    )
    op.create_index('ix_batch_items_job', 'batch_items', ['job_id'], unique=False)
    op.create_table('job_stages',
    sa.Column('job_id', sa.UUID(), nullable=False),
    sa.Column('stage', sa.String(length=24), nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('position', sa.SmallInteger(), nullable=False),
    sa.Column('status', sa.String(length=24), server_default='pending', nullable=False),
    sa.Column('input_fingerprint', sa.String(length=64), nullable=True),
    sa.Column('task_id', sa.UUID(), nullable=True),
    sa.Column('attempt_count', sa.Integer(), server_default='0', nullable=False),
    sa.Column('error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('retry_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("stage IN ('visual', 'agent', 'text_embedding')", name=op.f('ck_job_stages_stage_valid')),
    sa.CheckConstraint("status IN ('pending', 'queued', 'running', 'succeeded', 'reused', 'failed', 'blocked', 'unknown_execution', 'cancelled')", name=op.f('ck_job_stages_status_valid')),
    sa.ForeignKeyConstraint(['scope_id', 'job_id'], ['processing_jobs.scope_id', 'processing_jobs.id'], name=op.f('fk_job_stages_scope_id_job_id_processing_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'stage', name=op.f('pk_job_stages'))
    )
    op.create_table('tasks',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=False),
    sa.Column('stage', sa.String(length=24), nullable=False),
    sa.Column('lane', sa.String(length=16), nullable=False),
    sa.Column('resource_key', sa.Text(), server_default='', nullable=False),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('input_fingerprint', sa.String(length=64), nullable=False),
    sa.Column('dedupe_key', sa.String(length=64), nullable=False),
    sa.Column('image_id', sa.UUID(), nullable=False),
    sa.Column('image_sha256', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('priority', sa.SmallInteger(), server_default='0', nullable=False),
    sa.Column('available_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('lease_owner', sa.Text(), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('claim_generation', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('attempt_count', sa.Integer(), server_default='0', nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('last_hint_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancel_requested', sa.Boolean(), server_default='false', nullable=False),
    sa.Column('grant_id', sa.UUID(), nullable=True),
    sa.Column('error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('result', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("lane IN ('visual', 'agent', 'embedding')", name=op.f('ck_tasks_lane_valid')),
    sa.CheckConstraint("stage IN ('visual', 'agent', 'text_embedding')", name=op.f('ck_tasks_stage_valid')),
    sa.CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')", name=op.f('ck_tasks_status_valid')),
    sa.CheckConstraint('attempt_count >= 0 AND max_attempts >= 1', name=op.f('ck_tasks_attempts_valid')),
    sa.ForeignKeyConstraint(['scope_id', 'image_id'], ['images.scope_id', 'images.id'], name=op.f('fk_tasks_scope_id_image_id_images'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['scope_id', 'job_id'], ['processing_jobs.scope_id', 'processing_jobs.id'], name=op.f('fk_tasks_scope_id_job_id_processing_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tasks')),
    sa.UniqueConstraint('scope_id', 'id', name=op.f('uq_tasks_scope_id_id'))
    )
    op.create_index('ix_tasks_claimable', 'tasks', ['lane', 'resource_key', 'scope_id', sa.literal_column('priority DESC'), 'created_at'], unique=False, postgresql_where=sa.text("status = 'queued'"))
    op.create_index('ix_tasks_image', 'tasks', ['scope_id', 'image_id'], unique=False)
    op.create_index('ix_tasks_job', 'tasks', ['job_id'], unique=False)
    op.create_index('ix_tasks_lease', 'tasks', ['lease_expires_at'], unique=False, postgresql_where=sa.text("status = 'running'"))
    op.create_index('ix_tasks_queued_due', 'tasks', ['lane', 'available_at'], unique=False, postgresql_where=sa.text("status = 'queued'"))
    op.create_index('ix_tasks_rehint', 'tasks', [sa.literal_column('last_hint_at NULLS FIRST')], unique=False, postgresql_where=sa.text("status = 'queued'"))
    op.create_index('uq_tasks_active_dedupe', 'tasks', ['scope_id', 'dedupe_key'], unique=True, postgresql_where=sa.text("status IN ('queued', 'running')"))
    op.create_table('lane_slots',
    sa.Column('lane', sa.String(length=16), nullable=False),
    sa.Column('resource_key', sa.Text(), nullable=False),
    sa.Column('slot_no', sa.Integer(), nullable=False),
    sa.Column('task_id', sa.UUID(), nullable=True),
    sa.Column('claim_generation', sa.BigInteger(), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("lane IN ('visual', 'agent', 'embedding')", name=op.f('ck_lane_slots_lane_valid')),
    sa.ForeignKeyConstraint(['task_id'], ['tasks.id'], name=op.f('fk_lane_slots_task_id_tasks'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('lane', 'resource_key', 'slot_no', name=op.f('pk_lane_slots'))
    )
    op.create_index('ix_lane_slots_task', 'lane_slots', ['task_id'], unique=False, postgresql_where=sa.text('task_id IS NOT NULL'))
    op.create_table('task_attempts',
    sa.Column('attempt_id', sa.String(length=64), nullable=False),
    sa.Column('scope_id', sa.String(length=128), nullable=False),
    sa.Column('task_id', sa.UUID(), nullable=False),
    sa.Column('attempt_no', sa.Integer(), nullable=False),
    sa.Column('claim_generation', sa.BigInteger(), nullable=False),
    sa.Column('state', sa.String(length=24), nullable=False),
    sa.Column('input_digest', sa.String(length=64), nullable=False),
    sa.Column('target_sha256', sa.String(length=64), nullable=False),
    sa.Column('provider_request_id', sa.Text(), nullable=True),
    sa.Column('result', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("state IN ('prepared', 'external_started', 'completed', 'failed', 'unknown_execution')", name=op.f('ck_task_attempts_state_valid')),
    sa.ForeignKeyConstraint(['scope_id', 'task_id'], ['tasks.scope_id', 'tasks.id'], name=op.f('fk_task_attempts_scope_id_task_id_tasks'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('attempt_id', name=op.f('pk_task_attempts')),
    sa.UniqueConstraint('task_id', 'attempt_no', name=op.f('uq_task_attempts_task_id_attempt_no'))
    )
    op.create_index('ix_task_attempts_open', 'task_attempts', ['task_id'], unique=False, postgresql_where=sa.text("state = 'external_started'"))


def downgrade() -> None:
    op.drop_index('ix_task_attempts_open', table_name='task_attempts', postgresql_where=sa.text("state = 'external_started'"))
    op.drop_table('task_attempts')
    op.drop_index('ix_lane_slots_task', table_name='lane_slots', postgresql_where=sa.text('task_id IS NOT NULL'))
    op.drop_table('lane_slots')
    op.drop_index('uq_tasks_active_dedupe', table_name='tasks', postgresql_where=sa.text("status IN ('queued', 'running')"))
    op.drop_index('ix_tasks_rehint', table_name='tasks', postgresql_where=sa.text("status = 'queued'"))
    op.drop_index('ix_tasks_queued_due', table_name='tasks', postgresql_where=sa.text("status = 'queued'"))
    op.drop_index('ix_tasks_lease', table_name='tasks', postgresql_where=sa.text("status = 'running'"))
    op.drop_index('ix_tasks_job', table_name='tasks')
    op.drop_index('ix_tasks_image', table_name='tasks')
    op.drop_index('ix_tasks_claimable', table_name='tasks', postgresql_where=sa.text("status = 'queued'"))
    op.drop_table('tasks')
    op.drop_table('job_stages')
    op.drop_index('ix_batch_items_job', table_name='batch_items')
    op.drop_table('batch_items')
    op.drop_table('visual_embeddings')
    op.drop_index('ix_text_embeddings_scope_model', table_name='text_embeddings')
    op.drop_table('text_embeddings')
    op.drop_index('uq_processing_jobs_one_active_per_image', table_name='processing_jobs', postgresql_where=sa.text("status IN ('queued', 'running')"))
    op.drop_index('ix_processing_jobs_scope_page', table_name='processing_jobs')
    op.drop_index('ix_processing_jobs_needs_human', table_name='processing_jobs', postgresql_where=sa.text("status IN ('blocked', 'unknown_execution', 'failed')"))
    op.drop_index('ix_processing_jobs_image', table_name='processing_jobs')
    op.drop_index('ix_processing_jobs_batch', table_name='processing_jobs', postgresql_where=sa.text('batch_id IS NOT NULL'))
    op.drop_index('ix_processing_jobs_active', table_name='processing_jobs', postgresql_where=sa.text("status IN ('queued', 'running')"))
    op.drop_table('processing_jobs')
    op.drop_index('ix_operation_grants_usage', table_name='operation_grants')
    op.drop_table('operation_grants')
    op.drop_table('lane_fairness')
    op.drop_index('ix_images_scope_page', table_name='images')
    op.drop_table('images')
    op.drop_index('ix_batches_active', table_name='batches', postgresql_where=sa.text("status IN ('seeding', 'running')"))
    op.drop_table('batches')
    op.drop_table('api_tokens')
    op.drop_table('scopes')
    op.drop_table('ops_counters')
    op.execute('DROP EXTENSION IF EXISTS vector')
