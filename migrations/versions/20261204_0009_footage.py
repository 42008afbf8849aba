"""camcorder, broadcast and DVD footage: a video's field order and the span its header declares
(truncated: analysed only as far as it decodes); a frame set's deinterlacer and how it was
decoded when seeking was not possible

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 17:00:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('video', schema=None) as batch_op:
        batch_op.add_column(sa.Column('field_order', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('declared_duration_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('truncated', sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table('frame_set', schema=None) as batch_op:
        batch_op.add_column(sa.Column('deinterlace', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('decode_note', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('frame_set', schema=None) as batch_op:
        batch_op.drop_column('decode_note')
        batch_op.drop_column('deinterlace')
    with op.batch_alter_table('video', schema=None) as batch_op:
        batch_op.drop_column('truncated')
        batch_op.drop_column('declared_duration_s')
        batch_op.drop_column('field_order')
