"""structured results: answers as JSONB, reviewers' schema-valid edits, and their leaves indexed

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 19:40:00
"""
from __future__ import annotations

import json

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')


def _leaves(node, path="", item=None):
    # A frozen copy of vidlora.results.fields.leaves at this revision (a migration must not
    # change when the application does).
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _leaves(child, f"{path}.{key}" if path else str(key), item)
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _leaves(child, path, index if item is None else item)
    elif node is None or not path:
        return
    elif isinstance(node, bool):
        yield path, item, "true" if node else "false", None
    elif isinstance(node, (int, float)):
        yield path, item, None, float(node)
    else:
        yield path, item, str(node)[:512], None


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == 'postgresql':
        op.execute("ALTER TABLE result ALTER COLUMN parsed TYPE jsonb USING parsed::jsonb")
    with op.batch_alter_table('result', schema=None) as batch_op:
        batch_op.add_column(sa.Column('edited_parsed', DOCUMENT, nullable=True))
    op.create_table('result_field',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('result_id', sa.Integer(), nullable=False),
    sa.Column('path', sa.String(length=255), nullable=False),
    sa.Column('item', sa.Integer(), nullable=True),
    sa.Column('text', sa.String(length=512), nullable=True),
    sa.Column('num', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['result_id'], ['result.id'], name=op.f('fk_result_field_result_id_result'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_result_field'))
    )
    with op.batch_alter_table('result_field', schema=None) as batch_op:
        batch_op.create_index('ix_result_field_path_num', ['path', 'num'], unique=False)
        batch_op.create_index('ix_result_field_path_text', ['path', 'text'], unique=False)
        batch_op.create_index(batch_op.f('ix_result_field_result_id'), ['result_id'], unique=False)

    # Results stored before this revision get their fields (parsed is their current answer:
    # edits of structured answers did not exist).
    field = sa.table('result_field', sa.column('result_id', sa.Integer), sa.column('path', sa.String),
                     sa.column('item', sa.Integer), sa.column('text', sa.String), sa.column('num', sa.Float))
    rows = bind.execute(sa.text("SELECT id, parsed FROM result WHERE parsed IS NOT NULL"))
    for result_id, parsed in rows:
        value = json.loads(parsed) if isinstance(parsed, str) else parsed
        values = [{"result_id": result_id, "path": p[:255], "item": i, "text": t, "num": n}
                  for p, i, t, n in _leaves(value)]
        if values:
            bind.execute(field.insert(), values)


def downgrade() -> None:
    with op.batch_alter_table('result_field', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_result_field_result_id'))
        batch_op.drop_index('ix_result_field_path_text')
        batch_op.drop_index('ix_result_field_path_num')
    op.drop_table('result_field')
    with op.batch_alter_table('result', schema=None) as batch_op:
        batch_op.drop_column('edited_parsed')
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("ALTER TABLE result ALTER COLUMN parsed TYPE json USING parsed::json")
