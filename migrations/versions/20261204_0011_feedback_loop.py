"""the feedback loop: a result can be marked gold (held out of training exports, the set every
new adapter version is measured on), with when and by whom

Revision ID: 0011
Revises: 0008
Create Date: 2026-12-04 17:00:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('result', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gold_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('gold_by', sa.Integer(), nullable=True))
        batch_op.create_foreign_key('fk_result_gold_by_app_user', 'app_user', ['gold_by'], ['id'],
                                    ondelete='SET NULL')


def downgrade() -> None:
    with op.batch_alter_table('result', schema=None) as batch_op:
        batch_op.drop_constraint('fk_result_gold_by_app_user', type_='foreignkey')
        batch_op.drop_column('gold_by')
        batch_op.drop_column('gold_at')
