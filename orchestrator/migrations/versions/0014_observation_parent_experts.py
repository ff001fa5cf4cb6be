"""observations.parent_experts: the parent MoE's experts E of an expanded observation (an E-expert MoE grown to
n_expert = m·E experts). Null for every other kind and for rows from before.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('observations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('parent_experts', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('observations', schema=None) as batch_op:
        batch_op.drop_column('parent_experts')
