"""a scenario's latency target (scenarios.yaml slo.p95_seconds), shown as met or missed

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 01:20:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('scenario', schema=None) as batch_op:
        batch_op.add_column(sa.Column('latency_target_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('scenario', schema=None) as batch_op:
        batch_op.drop_column('latency_target_s')
