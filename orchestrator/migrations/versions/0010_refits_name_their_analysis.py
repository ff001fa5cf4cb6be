"""Every refit version names the analysis it ran: refits.analysis_id becomes required and refits.fits (the fit ids
a refit listed when it fitted laws one by one) goes. Rows without an analysis cannot be shown as a refit any more and
are deleted; going back down restores the column empty.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("DELETE FROM refits WHERE analysis_id IS NULL"))
    with op.batch_alter_table('refits', schema=None) as batch_op:
        batch_op.drop_column('fits')
        batch_op.alter_column('analysis_id', existing_type=sa.String(length=16), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table('refits', schema=None) as batch_op:
        batch_op.alter_column('analysis_id', existing_type=sa.String(length=16), nullable=True)
        batch_op.add_column(sa.Column('fits', sa.JSON(), server_default='{}', nullable=False))
