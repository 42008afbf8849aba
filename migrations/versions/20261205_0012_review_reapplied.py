"""a review's conflict re-apply

``review.reapplied_from``: the version a reviewer's page showed when their save, approve or
reject was refused as stale; set on the action they then applied from the conflict page, so
the history says it was applied over another reviewer's change on purpose

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 20:00:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('review', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reapplied_from', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('review', schema=None) as batch_op:
        batch_op.drop_column('reapplied_from')
