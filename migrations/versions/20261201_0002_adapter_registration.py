"""adapter registration verdict on scenarios

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 20:50:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('scenario', schema=None) as batch_op:
        batch_op.add_column(sa.Column('adapter_status', sa.String(length=16), server_default='unchecked',
                                      nullable=False))
        batch_op.add_column(sa.Column('adapter_reason', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('adapter_digest', sa.String(length=64), nullable=True))
        batch_op.create_check_constraint(
            batch_op.f('ck_scenario_adapter_status'),
            "adapter_status IN ('unchecked', 'ok', 'refused', 'none')")


def downgrade() -> None:
    with op.batch_alter_table('scenario', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('ck_scenario_adapter_status'), type_='check')
        batch_op.drop_column('adapter_digest')
        batch_op.drop_column('adapter_reason')
        batch_op.drop_column('adapter_status')
