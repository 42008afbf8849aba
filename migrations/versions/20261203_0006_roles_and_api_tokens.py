"""roles (reviewer, admin) and API tokens (hashed, scoped, revocable)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 01:00:00

Existing accounts become reviewers; the oldest account becomes an admin, so a deployment keeps
someone who can manage accounts from the web (``vidlora user role NAME admin`` changes it).
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('app_user', schema=None) as batch_op:
        batch_op.add_column(sa.Column('role', sa.String(length=16), server_default='reviewer', nullable=False))
        batch_op.create_check_constraint('role', "role IN ('reviewer', 'admin')")
    op.execute("UPDATE app_user SET role = 'admin' WHERE id = (SELECT min(id) FROM app_user)")
    op.create_table(
        'api_token',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=100), nullable=False),
        sa.Column('prefix', sa.String(length=16), nullable=False),
        sa.Column('token_hash', sa.String(length=64), nullable=False),
        sa.Column('scope', sa.String(length=16), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("scope IN ('read', 'review')", name=op.f('ck_api_token_scope')),
        sa.ForeignKeyConstraint(['user_id'], ['app_user.id'], name=op.f('fk_api_token_user_id_app_user'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_api_token')),
        sa.UniqueConstraint('token_hash', name=op.f('uq_api_token_token_hash')),
    )
    op.create_index(op.f('ix_api_token_user_id'), 'api_token', ['user_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_api_token_user_id'), table_name='api_token')
    op.drop_table('api_token')
    with op.batch_alter_table('app_user', schema=None) as batch_op:
        batch_op.drop_constraint('role', type_='check')
        batch_op.drop_column('role')
