"""the reviewed results' own index; a facet's count without DISTINCT

Two reads that grew with every result (issue 58, 100k results):

- Agreement and calibration score a scenario's reviewed answers only: a tenth of its results,
  where a team reviews as it goes. They were found by reading every result. A partial index on
  the reviewed ones (``ix_result_reviewed``) finds them alone.
- A facet counts results per value; a result with two bronze finds has two field rows with
  that value, so the count was ``count(DISTINCT result_id)``, which sorts every field row of
  the scenario. ``result_field.repeat`` marks each row after the first of its result with the
  same path and value, and the count skips them. Existing rows are marked here.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07 18:10:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None

REVIEWED = sa.text("review_state <> 'unreviewed'")


def upgrade() -> None:
    op.create_index('ix_result_reviewed', 'result', ['analysis_id'], unique=False,
                    postgresql_where=REVIEWED, sqlite_where=REVIEWED)
    with op.batch_alter_table('result_field', schema=None) as batch_op:
        batch_op.add_column(sa.Column('repeat', sa.Boolean(), server_default=sa.false(), nullable=False))
    # The rows after the first of their result, path and value (by item, then id: the order
    # vidlora.results.fields.index_fields writes them in). Window functions: PostgreSQL, and
    # SQLite since 3.25.
    op.execute("""
        UPDATE result_field SET repeat = true WHERE id IN (
            SELECT id FROM (
                SELECT id, row_number() OVER (PARTITION BY result_id, path, text, num
                                              ORDER BY item, id) AS nth
                FROM result_field) ranked
            WHERE nth > 1)""")


def downgrade() -> None:
    with op.batch_alter_table('result_field', schema=None) as batch_op:
        batch_op.drop_column('repeat')
    op.drop_index('ix_result_reviewed', table_name='result')
