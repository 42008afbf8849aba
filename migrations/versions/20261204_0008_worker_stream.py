"""a GPU worker's streaming loop as its heartbeat reports it (in flight per adapter, admission
wait, tokens/s), shown by `vidlora status` and the Scenarios page; a result's output tokens

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 14:00:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('worker', schema=None) as batch_op:
        batch_op.add_column(sa.Column('stream', sa.JSON(), nullable=True))
    with op.batch_alter_table('result', schema=None) as batch_op:
        batch_op.add_column(sa.Column('token_ids', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('result', schema=None) as batch_op:
        batch_op.drop_column('token_ids')
    with op.batch_alter_table('worker', schema=None) as batch_op:
        batch_op.drop_column('stream')
