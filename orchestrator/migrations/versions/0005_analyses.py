"""The analyses table (control/records.py AnalysisRecord): one row per run of the paper's analysis on a set of sweeps,
unique per (sweeps, inputs) so that two triggers for the same inputs make one analysis; and refits.analysis_id and
refits.dstar_group: the analysis a refit version ran and the upcycling group its D* is of.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('analyses',
    sa.Column('id', sa.String(length=16), nullable=False),
    sa.Column('sweep_ids', sa.JSON(), nullable=False),
    sa.Column('sweep_key', sa.String(length=400), nullable=False),
    sa.Column('inputs_hash', sa.String(length=64), nullable=False),
    sa.Column('observations_hash', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('trigger', sa.String(length=16), nullable=False),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('record', sa.JSON(), nullable=True),
    sa.Column('plots', sa.JSON(), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('sweep_key', 'inputs_hash')
    )
    with op.batch_alter_table('analyses', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_analyses_sweep_key'), ['sweep_key'], unique=False)
    with op.batch_alter_table('refits', schema=None) as batch_op:
        batch_op.add_column(sa.Column('analysis_id', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('dstar_group', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('refits', schema=None) as batch_op:
        batch_op.drop_column('dstar_group')
        batch_op.drop_column('analysis_id')
    with op.batch_alter_table('analyses', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_analyses_sweep_key'))
    op.drop_table('analyses')
