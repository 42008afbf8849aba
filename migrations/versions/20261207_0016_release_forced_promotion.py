"""a forced promotion's reason

``adapter_release.forced_reason`` / ``forced_over``: `vidlora scenarios promote --force --reason`
serves a candidate the gold-set check refused (refusals, errors, missing answers, or worse than
the serving version beyond its interval); the release keeps the person's reason and what the
check said, so the history tells why a version that failed its exam served.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 04:00:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('adapter_release', schema=None) as batch_op:
        batch_op.add_column(sa.Column('forced_reason', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('forced_over', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('adapter_release', schema=None) as batch_op:
        batch_op.drop_column('forced_over')
        batch_op.drop_column('forced_reason')
