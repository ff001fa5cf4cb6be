"""sweeps.submission_key: unique, so that identical submissions racing each other record one sweep: the second
insert fails on the key and its request answers with the first one's sweep (control/sweeps.py `submit`). Older rows,
and sweeps asked for as new, have none (NULLs never collide).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('submission_key', sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f('ix_sweeps_submission_key'), ['submission_key'], unique=True)


def downgrade() -> None:
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sweeps_submission_key'))
        batch_op.drop_column('submission_key')
