"""session tokens (a signed cookie dies at sign-out and password change) and sign-in throttling

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 20:40:00
"""
from __future__ import annotations

import secrets

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('app_user', schema=None) as batch_op:
        batch_op.add_column(sa.Column('session_token', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('failed_logins', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('locked_until', sa.DateTime(timezone=True), nullable=True))
    bind = op.get_bind()
    for (user_id,) in bind.execute(sa.text("SELECT id FROM app_user")).all():
        bind.execute(sa.text("UPDATE app_user SET session_token = :t WHERE id = :i"),
                     {"t": secrets.token_hex(16), "i": user_id})
    with op.batch_alter_table('app_user', schema=None) as batch_op:
        batch_op.alter_column('session_token', existing_type=sa.String(length=64), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table('app_user', schema=None) as batch_op:
        batch_op.drop_column('locked_until')
        batch_op.drop_column('failed_logins')
        batch_op.drop_column('session_token')
