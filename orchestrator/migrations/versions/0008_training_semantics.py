"""A segment's training-semantics version: segments.semantics (the version its config was trained under),
segments.unversioned_key (its key under version 1, equal for the same job under any version, indexed: how a planned
segment finds a stale one) and segments.reused_from (the stale segment a `--reuse-stale` sweep took its result from);
sweeps.stale_segments and sweeps.reuse_stale record what a sweep found stale and whether it reused it.

Every stored segment was trained under version 1, which is left out of the hash (sweeps/segments.py,
TRAINING_SEMANTICS): its unversioned key is its key, and its config gets `semantics: 1` so that it still reads (and
hashes) as version 1 once the running code's version is higher.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

_segments = sa.table('segments', sa.column('key', sa.String), sa.column('config', sa.JSON),
                     sa.column('unversioned_key', sa.String))


def upgrade() -> None:
    with op.batch_alter_table('segments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('semantics', sa.Integer(), server_default='1', nullable=False))
        batch_op.add_column(sa.Column('unversioned_key', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('reused_from', sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f('ix_segments_unversioned_key'), ['unversioned_key'], unique=False)
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('stale_segments', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('reuse_stale', sa.Boolean(), server_default=sa.false(), nullable=False))
    conn = op.get_bind()
    for key, config in conn.execute(sa.select(_segments.c.key, _segments.c.config)).all():
        values = {"unversioned_key": key}
        if config is not None and "semantics" not in config:
            values["config"] = {**config, "semantics": 1}
        conn.execute(sa.update(_segments).where(_segments.c.key == key).values(**values))


def downgrade() -> None:
    """Code from before 0008 refuses a config naming `semantics`: version 1's is dropped (it is what that code ran);
    a segment of a later version cannot be read by that code whatever this does."""
    conn = op.get_bind()
    for key, config in conn.execute(sa.select(_segments.c.key, _segments.c.config)).all():
        if config is not None and config.get("semantics") == 1:
            conn.execute(sa.update(_segments).where(_segments.c.key == key)
                         .values(config={k: v for k, v in config.items() if k != "semantics"}))
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_column('reuse_stale')
        batch_op.drop_column('stale_segments')
    with op.batch_alter_table('segments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_segments_unversioned_key'))
        batch_op.drop_column('reused_from')
        batch_op.drop_column('unversioned_key')
        batch_op.drop_column('semantics')
