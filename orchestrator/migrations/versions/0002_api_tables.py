"""The API's tables: tokens, sweep owners, fits, refit schedules, refit records (control/records.py).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 12:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('api_tokens',
    sa.Column('id', sa.String(length=16), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('scope', sa.String(length=8), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('token_hash')
    )
    op.create_table('sweep_owners',
    sa.Column('sweep_id', sa.String(length=32), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('extends', sa.String(length=32), nullable=True),
    sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('sweep_id')
    )
    op.create_table('fits',
    sa.Column('id', sa.String(length=16), nullable=False),
    sa.Column('law', sa.String(length=32), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('report', sa.JSON(), nullable=False),
    sa.Column('data_hash', sa.String(length=64), nullable=False),
    sa.Column('plots', sa.JSON(), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('fits', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_fits_kind'), ['kind'], unique=False)
        batch_op.create_index(batch_op.f('ix_fits_law'), ['law'], unique=False)
    op.create_table('refit_schedules',
    sa.Column('id', sa.String(length=16), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('trigger', sa.String(length=32), nullable=False),
    sa.Column('cron', sa.String(length=100), nullable=True),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('active', sa.Boolean(), nullable=False),
    sa.Column('last_error', sa.String(length=2000), nullable=True),
    sa.Column('last_checked_hash', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('refits',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('schedule_id', sa.String(length=16), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('inputs_hash', sa.String(length=64), nullable=False),
    sa.Column('fits', sa.JSON(), nullable=False),
    sa.Column('dstar', sa.Float(), nullable=True),
    sa.Column('dstar_ci', sa.JSON(), nullable=True),
    sa.Column('diff', sa.JSON(), nullable=False),
    sa.Column('left_interval', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['schedule_id'], ['refit_schedules.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('schedule_id', 'version')
    )
    with op.batch_alter_table('refits', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_refits_schedule_id'), ['schedule_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('refits', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_refits_schedule_id'))
    op.drop_table('refits')
    op.drop_table('refit_schedules')
    with op.batch_alter_table('fits', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_fits_law'))
        batch_op.drop_index(batch_op.f('ix_fits_kind'))
    op.drop_table('fits')
    op.drop_table('sweep_owners')
    op.drop_table('api_tokens')
