"""refit_schedules.last_fired_minute: the cron minute a refit loop claimed, so that loops racing on one schedule
(serve + `upscale scheduler`, or two replicas) fire it once per matching minute (control/refits.py).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 19:15:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('refit_schedules', schema=None) as batch_op:
        batch_op.add_column(sa.Column('last_fired_minute', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('refit_schedules', schema=None) as batch_op:
        batch_op.drop_column('last_fired_minute')
