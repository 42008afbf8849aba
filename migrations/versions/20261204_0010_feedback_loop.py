"""the feedback loop: a result can be marked gold (held out of training exports, the set every
new adapter version is measured on), with when and by whom; adapter releases (a scenario's
adapter versions: candidate, serving, retired) with their answers on the gold set

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 17:00:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'adapter_release',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('scenario_id', sa.Integer(), nullable=False),
        sa.Column('version', sa.String(length=64), nullable=False),
        sa.Column('path', sa.String(length=1024), nullable=False),
        sa.Column('declared_path', sa.String(length=1024), nullable=True),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('previous_id', sa.Integer(), nullable=True),
        sa.Column('note', sa.Text(), nullable=True),
        sa.Column('gold_answers', sa.JSON(), nullable=True),
        sa.Column('gold_run_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('promoted_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('candidate', 'serving', 'retired')", name=op.f('ck_adapter_release_status')),
        sa.ForeignKeyConstraint(['previous_id'], ['adapter_release.id'],
                                name=op.f('fk_adapter_release_previous_id_adapter_release'), ondelete='SET NULL'),
        sa.ForeignKeyConstraint(['scenario_id'], ['scenario.id'],
                                name=op.f('fk_adapter_release_scenario_id_scenario'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_adapter_release')),
        sa.UniqueConstraint('scenario_id', 'version', name=op.f('uq_adapter_release_scenario_id_version')),
    )
    op.create_index(op.f('ix_adapter_release_scenario_id'), 'adapter_release', ['scenario_id'], unique=False)
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
    op.drop_index(op.f('ix_adapter_release_scenario_id'), table_name='adapter_release')
    op.drop_table('adapter_release')
