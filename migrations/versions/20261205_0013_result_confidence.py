"""result confidence: how sure the model was of each answer and of each of its fields

The worker reads it from the logprobs of the tokens that wrote each top-level field's value
(vidlora.results.confidence); the review queue orders by it, least certain first, and
calibration compares it with what reviewers found. Results stored before stay NULL: unknown.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 20:00:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('result', schema=None) as batch_op:
        batch_op.add_column(sa.Column('confidence', sa.Float(), nullable=True))
        batch_op.create_index(batch_op.f('ix_result_confidence'), ['confidence'], unique=False)
    op.create_table('result_confidence',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('result_id', sa.Integer(), nullable=False),
    sa.Column('field', sa.String(length=255), nullable=False),
    sa.Column('confidence', sa.Float(), nullable=False),
    sa.Column('tokens', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['result_id'], ['result.id'], name=op.f('fk_result_confidence_result_id_result'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_result_confidence'))
    )
    with op.batch_alter_table('result_confidence', schema=None) as batch_op:
        batch_op.create_index('ix_result_confidence_field_confidence', ['field', 'confidence'], unique=False)
        batch_op.create_index(batch_op.f('ix_result_confidence_result_id'), ['result_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('result_confidence', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_result_confidence_result_id'))
        batch_op.drop_index('ix_result_confidence_field_confidence')
    op.drop_table('result_confidence')
    with op.batch_alter_table('result', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_result_confidence'))
        batch_op.drop_column('confidence')
