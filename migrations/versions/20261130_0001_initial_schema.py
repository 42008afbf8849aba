"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 01:11:56.775751
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None

FTS_INDEX = (
    "CREATE INDEX ix_result_fts ON result USING gin "
    "(to_tsvector('english', coalesce(edited_text, text)))"
)


def upgrade() -> None:
    op.create_table('app_user',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('username', sa.String(length=64), nullable=False),
    sa.Column('password_hash', sa.String(length=255), nullable=False),
    sa.Column('is_active', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_app_user')),
    sa.UniqueConstraint('username', name=op.f('uq_app_user_username'))
    )
    op.create_table('batch',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('source', sa.String(length=16), nullable=False),
    sa.Column('scenario_names', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('created_by', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("status IN ('ingesting', 'ingested', 'failed')", name=op.f('ck_batch_status')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_batch'))
    )
    op.create_table('scenario',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('title', sa.String(length=200), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('adapter_path', sa.String(length=1024), nullable=True),
    sa.Column('adapter_version', sa.String(length=64), nullable=True),
    sa.Column('system_prompt', sa.Text(), nullable=True),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('sampling', sa.JSON(), nullable=False),
    sa.Column('generation', sa.JSON(), nullable=False),
    sa.Column('output_schema', sa.JSON(), nullable=True),
    sa.Column('active', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_scenario')),
    sa.UniqueConstraint('name', name=op.f('uq_scenario_name'))
    )
    op.create_table('video',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('path', sa.String(length=1024), nullable=False),
    sa.Column('original_name', sa.String(length=1024), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('container', sa.String(length=64), nullable=True),
    sa.Column('codec', sa.String(length=64), nullable=True),
    sa.Column('width', sa.Integer(), nullable=True),
    sa.Column('height', sa.Integer(), nullable=True),
    sa.Column('rotation', sa.Integer(), nullable=True),
    sa.Column('fps', sa.Float(), nullable=True),
    sa.Column('duration_s', sa.Float(), nullable=True),
    sa.Column('frame_count', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("status IN ('registered', 'probing', 'ready', 'rejected', 'failed')", name=op.f('ck_video_status')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_video')),
    sa.UniqueConstraint('sha256', name=op.f('uq_video_sha256'))
    )
    op.create_table('worker',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('queue', sa.String(length=160), nullable=False),
    sa.Column('device', sa.String(length=255), nullable=True),
    sa.Column('versions', sa.JSON(), nullable=False),
    sa.Column('adapters_resident', sa.JSON(), nullable=False),
    sa.Column('adapter_loads', sa.Integer(), nullable=False),
    sa.Column('last_canary', sa.JSON(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_worker')),
    sa.UniqueConstraint('name', name=op.f('uq_worker_name'))
    )
    op.create_table('batch_item',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('batch_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=1024), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('video_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("status IN ('stored', 'rejected', 'skipped')", name=op.f('ck_batch_item_status')),
    sa.ForeignKeyConstraint(['batch_id'], ['batch.id'], name=op.f('fk_batch_item_batch_id_batch'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['video_id'], ['video.id'], name=op.f('fk_batch_item_video_id_video')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_batch_item')),
    sa.UniqueConstraint('batch_id', 'name', name=op.f('uq_batch_item_batch_id_name'))
    )
    op.create_index(op.f('ix_batch_item_batch_id'), 'batch_item', ['batch_id'], unique=False)
    op.create_index(op.f('ix_batch_item_video_id'), 'batch_item', ['video_id'], unique=False)
    op.create_table('frame_set',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('video_id', sa.Integer(), nullable=False),
    sa.Column('policy_key', sa.String(length=255), nullable=False),
    sa.Column('policy', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('timestamps', sa.JSON(), nullable=False),
    sa.Column('files', sa.JSON(), nullable=False),
    sa.Column('width', sa.Integer(), nullable=True),
    sa.Column('height', sa.Integer(), nullable=True),
    sa.Column('backend', sa.String(length=32), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("status IN ('pending', 'done', 'failed')", name=op.f('ck_frame_set_status')),
    sa.ForeignKeyConstraint(['video_id'], ['video.id'], name=op.f('fk_frame_set_video_id_video'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_frame_set')),
    sa.UniqueConstraint('video_id', 'policy_key', name=op.f('uq_frame_set_video_id_policy_key'))
    )
    op.create_index(op.f('ix_frame_set_video_id'), 'frame_set', ['video_id'], unique=False)
    op.create_table('upload',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('batch_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=1024), nullable=False),
    sa.Column('path', sa.String(length=1024), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("status IN ('pending', 'done', 'failed')", name=op.f('ck_upload_status')),
    sa.ForeignKeyConstraint(['batch_id'], ['batch.id'], name=op.f('fk_upload_batch_id_batch'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_upload'))
    )
    op.create_index(op.f('ix_upload_batch_id'), 'upload', ['batch_id'], unique=False)
    op.create_table('analysis',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('video_id', sa.Integer(), nullable=False),
    sa.Column('scenario_id', sa.Integer(), nullable=False),
    sa.Column('batch_id', sa.Integer(), nullable=True),
    sa.Column('frame_set_id', sa.Integer(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('worker', sa.String(length=128), nullable=True),
    sa.Column('engine', sa.JSON(), nullable=True),
    sa.Column('adapter_version', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ready_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('queued_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('pending', 'ready', 'queued', 'running', 'done', 'failed', 'rejected')", name=op.f('ck_analysis_status')),
    sa.ForeignKeyConstraint(['batch_id'], ['batch.id'], name=op.f('fk_analysis_batch_id_batch'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['frame_set_id'], ['frame_set.id'], name=op.f('fk_analysis_frame_set_id_frame_set')),
    sa.ForeignKeyConstraint(['scenario_id'], ['scenario.id'], name=op.f('fk_analysis_scenario_id_scenario')),
    sa.ForeignKeyConstraint(['video_id'], ['video.id'], name=op.f('fk_analysis_video_id_video'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_analysis')),
    sa.UniqueConstraint('video_id', 'scenario_id', name=op.f('uq_analysis_video_id_scenario_id'))
    )
    op.create_index(op.f('ix_analysis_batch_id'), 'analysis', ['batch_id'], unique=False)
    op.create_index(op.f('ix_analysis_scenario_id'), 'analysis', ['scenario_id'], unique=False)
    op.create_index('ix_analysis_status_scenario', 'analysis', ['status', 'scenario_id'], unique=False)
    op.create_index(op.f('ix_analysis_video_id'), 'analysis', ['video_id'], unique=False)
    op.create_table('result',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('analysis_id', sa.Integer(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('parsed', sa.JSON(), nullable=True),
    sa.Column('prompt_tokens', sa.Integer(), nullable=False),
    sa.Column('output_tokens', sa.Integer(), nullable=False),
    sa.Column('latency_s', sa.Float(), nullable=False),
    sa.Column('finish_reason', sa.String(length=32), nullable=True),
    sa.Column('health', sa.JSON(), nullable=False),
    sa.Column('model', sa.String(length=1024), nullable=False),
    sa.Column('adapter', sa.String(length=255), nullable=True),
    sa.Column('adapter_version', sa.String(length=64), nullable=True),
    sa.Column('review_state', sa.String(length=16), nullable=False),
    sa.Column('edited_text', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("review_state IN ('unreviewed', 'approved', 'rejected', 'edited')", name=op.f('ck_result_review_state')),
    sa.ForeignKeyConstraint(['analysis_id'], ['analysis.id'], name=op.f('fk_result_analysis_id_analysis'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_result')),
    sa.UniqueConstraint('analysis_id', name=op.f('uq_result_analysis_id'))
    )
    op.create_table('review',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('result_id', sa.Integer(), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=True),
    sa.Column('action', sa.String(length=16), nullable=False),
    sa.Column('text', sa.Text(), nullable=True),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("action IN ('approve', 'reject', 'edit', 'note')", name=op.f('ck_review_action')),
    sa.ForeignKeyConstraint(['result_id'], ['result.id'], name=op.f('fk_review_result_id_result'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['app_user.id'], name=op.f('fk_review_user_id_app_user'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_review'))
    )
    op.create_index(op.f('ix_review_result_id'), 'review', ['result_id'], unique=False)


    # Full-text search over results (the review UI's query page). PostgreSQL only: the
    # embedded SQLite set-up falls back to substring search.
    if op.get_bind().dialect.name == "postgresql":
        op.execute(FTS_INDEX)

def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_result_fts")
    op.drop_index(op.f('ix_review_result_id'), table_name='review')
    op.drop_table('review')
    op.drop_table('result')
    op.drop_index(op.f('ix_analysis_video_id'), table_name='analysis')
    op.drop_index('ix_analysis_status_scenario', table_name='analysis')
    op.drop_index(op.f('ix_analysis_scenario_id'), table_name='analysis')
    op.drop_index(op.f('ix_analysis_batch_id'), table_name='analysis')
    op.drop_table('analysis')
    op.drop_index(op.f('ix_upload_batch_id'), table_name='upload')
    op.drop_table('upload')
    op.drop_index(op.f('ix_frame_set_video_id'), table_name='frame_set')
    op.drop_table('frame_set')
    op.drop_index(op.f('ix_batch_item_video_id'), table_name='batch_item')
    op.drop_index(op.f('ix_batch_item_batch_id'), table_name='batch_item')
    op.drop_table('batch_item')
    op.drop_table('worker')
    op.drop_table('video')
    op.drop_table('scenario')
    op.drop_table('batch')
    op.drop_table('app_user')
