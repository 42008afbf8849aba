"""adapter fingerprint on scenarios (stat-only change detection for adapter_version)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 06:00:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('scenario', schema=None) as batch_op:
        batch_op.add_column(sa.Column('adapter_fingerprint', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('scenario', schema=None) as batch_op:
        batch_op.drop_column('adapter_fingerprint')
