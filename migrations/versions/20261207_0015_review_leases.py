"""review leases, names in NFC, indexes for 100k results

- review_lease: a reviewer holds an answer opened from the review queue for a while (renewed
  while the page is open), so the queue hands colleagues the next one (web.review.leases).
- Names stored before in another Unicode form (a Mac's NFD) become NFC, as new ones are
  (vidlora.names); a batch member whose NFC name another member already has keeps its form.
- Indexes the review queue and the Results page read at 100k results.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 04:00:00
"""
from __future__ import annotations

import unicodedata

from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def _nfc_names() -> None:
    bind = op.get_bind()
    for table, column in (("video", "original_name"), ("batch", "name")):
        rows = bind.execute(sa.text(f"SELECT id, {column} FROM {table}")).all()
        for row_id, name in rows:
            if name is not None and not unicodedata.is_normalized("NFC", name):
                bind.execute(sa.text(f"UPDATE {table} SET {column} = :name WHERE id = :id"),
                             {"name": unicodedata.normalize("NFC", name), "id": row_id})
    taken = {(b, n) for b, n in bind.execute(sa.text("SELECT batch_id, name FROM batch_item")).all()}
    for row_id, batch_id, name in bind.execute(sa.text("SELECT id, batch_id, name FROM batch_item")).all():
        nfc = unicodedata.normalize("NFC", name)
        if nfc != name and (batch_id, nfc) not in taken:
            bind.execute(sa.text("UPDATE batch_item SET name = :name WHERE id = :id"), {"name": nfc, "id": row_id})
            taken.add((batch_id, nfc))


def upgrade() -> None:
    op.create_table('review_lease',
    sa.Column('result_id', sa.Integer(), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['result_id'], ['result.id'], name=op.f('fk_review_lease_result_id_result'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['app_user.id'], name=op.f('fk_review_lease_user_id_app_user'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('result_id', name=op.f('pk_review_lease'))
    )
    with op.batch_alter_table('review_lease', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_review_lease_expires_at'), ['expires_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_review_lease_user_id'), ['user_id'], unique=False)
    _nfc_names()


def downgrade() -> None:
    with op.batch_alter_table('review_lease', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_review_lease_user_id'))
        batch_op.drop_index(batch_op.f('ix_review_lease_expires_at'))
    op.drop_table('review_lease')
