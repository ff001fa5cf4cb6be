"""sweeps.spec_hash: the hash of the validated spec, indexed, so that an identical re-submission finds its sweep
instead of making a new one (orchestrator/service.py `spec_hash`). Rows from before have none and are never matched.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('spec_hash', sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f('ix_sweeps_spec_hash'), ['spec_hash'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sweeps_spec_hash'))
        batch_op.drop_column('spec_hash')
