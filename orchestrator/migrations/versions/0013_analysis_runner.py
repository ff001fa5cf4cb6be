"""An analysis row names the process running it (host:pid:nonce, as a sweep names its scheduler), so a row left
`running` by a server that stopped or crashed is recognised as orphaned at once instead of after an hour. Older rows
have none (null) and keep the old rule: taken over once older than the stale limit.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('analyses', schema=None) as batch_op:
        batch_op.add_column(sa.Column('runner', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('analyses', schema=None) as batch_op:
        batch_op.drop_column('runner')
