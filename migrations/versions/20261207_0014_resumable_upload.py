"""resumable uploads (issue 59): files that arrive in pieces over tus

One row per tus upload: its owner, the name and length it declared, the bytes received so far
(its offset) and where they are in the media store; handed to a batch once complete. Stalled
rows are expired by the reconciler with their bytes.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 04:00:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('resumable_upload',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('filename', sa.String(length=255), nullable=False),
    sa.Column('length', sa.BigInteger(), nullable=False),
    sa.Column('offset', sa.BigInteger(), nullable=False),
    sa.Column('path', sa.String(length=1024), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('batch_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("status IN ('receiving', 'complete', 'submitted')", name=op.f('ck_resumable_upload_status')),
    sa.ForeignKeyConstraint(['batch_id'], ['batch.id'], name=op.f('fk_resumable_upload_batch_id_batch'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['user_id'], ['app_user.id'], name=op.f('fk_resumable_upload_user_id_app_user'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_resumable_upload')),
    sa.UniqueConstraint('key', name=op.f('uq_resumable_upload_key'))
    )
    with op.batch_alter_table('resumable_upload', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_resumable_upload_updated_at'), ['updated_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_resumable_upload_user_id'), ['user_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('resumable_upload', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_resumable_upload_user_id'))
        batch_op.drop_index(batch_op.f('ix_resumable_upload_updated_at'))
    op.drop_table('resumable_upload')
