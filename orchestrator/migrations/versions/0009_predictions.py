"""The prediction ledger: one row per (sweep, observation segment) with the loss the newest analysis predicted for
it before it trained and its nominal 80% and 95% intervals, scored (observed loss, absolute error, inside or not)
once it finishes (control/ledger.py).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('predictions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('sweep_id', sa.String(length=32), nullable=False),
    sa.Column('segment_key', sa.String(length=64), nullable=False),
    sa.Column('analysis_id', sa.String(length=16), nullable=False),
    sa.Column('law', sa.String(length=200), nullable=False),
    sa.Column('predicted', sa.Float(), nullable=False),
    sa.Column('sigma_fit', sa.Float(), nullable=False),
    sa.Column('sigma_noise', sa.Float(), nullable=False),
    sa.Column('lo80', sa.Float(), nullable=False),
    sa.Column('hi80', sa.Float(), nullable=False),
    sa.Column('lo95', sa.Float(), nullable=False),
    sa.Column('hi95', sa.Float(), nullable=False),
    sa.Column('observed', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('scored_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['segment_key'], ['segments.key']),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('sweep_id', 'segment_key')
    )
    with op.batch_alter_table('predictions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_predictions_sweep_id'), ['sweep_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_predictions_segment_key'), ['segment_key'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('predictions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_predictions_segment_key'))
        batch_op.drop_index(batch_op.f('ix_predictions_sweep_id'))
    op.drop_table('predictions')
