"""review versions, and a sign-in throttle that locks nobody out

A result's review version: every review action moves it on, and a save, approve or reject
made against an older one is refused (409) instead of silently undoing another reviewer's
work; each review row records the version it produced, so "what changed since" is a query.
Wrong-password counts leave app_user: they are per address and per account and address now,
in Redis (web.auth.throttle), never per account alone (which let anyone lock a user out)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 17:00:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('result', schema=None) as batch_op:
        batch_op.add_column(sa.Column('review_version', sa.Integer(), server_default='0', nullable=False))
    with op.batch_alter_table('review', schema=None) as batch_op:
        batch_op.add_column(sa.Column('version', sa.Integer(), nullable=True))
    with op.batch_alter_table('app_user', schema=None) as batch_op:
        batch_op.drop_column('locked_until')
        batch_op.drop_column('failed_logins')


def downgrade() -> None:
    with op.batch_alter_table('app_user', schema=None) as batch_op:
        batch_op.add_column(sa.Column('failed_logins', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('locked_until', sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table('review', schema=None) as batch_op:
        batch_op.drop_column('version')
    with op.batch_alter_table('result', schema=None) as batch_op:
        batch_op.drop_column('review_version')
