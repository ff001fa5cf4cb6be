"""A refit version keeps its whole D* answer: where D* lies (a crossing, or beyond the searched range), its 80% and
95% intervals with open ends said as such, how far it lies from the trained ranges and the health of the fits under
it, as the analysis gave them. Older versions have none (null).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('refits', schema=None) as batch_op:
        batch_op.add_column(sa.Column('dstar_answer', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('refits', schema=None) as batch_op:
        batch_op.drop_column('dstar_answer')
