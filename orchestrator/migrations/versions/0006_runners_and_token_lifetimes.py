"""sweeps.runner and sweeps.runner_heartbeat_at: the scheduler process that drives a running or cancelling sweep and
when it last said it was alive, so that a scheduler starting after a crash adopts the sweeps whose runner is gone;
api_tokens.expires_at and api_tokens.revoked_at: a token stops working once either is past.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('runner', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('runner_heartbeat_at', sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_column('revoked_at')
        batch_op.drop_column('expires_at')
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_column('runner_heartbeat_at')
        batch_op.drop_column('runner')
