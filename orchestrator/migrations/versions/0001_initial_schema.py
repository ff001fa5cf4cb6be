"""Initial schema: sweeps, segments, membership, attempts, observations, checkpoints.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-23 11:42:43.187549
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('segments',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('parents', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('tokens', sa.BigInteger(), nullable=False),
    sa.Column('flops', sa.Float(), nullable=False),
    sa.Column('trunk', sa.String(length=64), nullable=True),
    sa.Column('observation', sa.JSON(), nullable=True),
    sa.Column('checkpoint_uri', sa.Text(), nullable=True),
    sa.Column('mlflow_run_id', sa.String(length=64), nullable=True),
    sa.Column('result', sa.JSON(), nullable=True),
    sa.Column('owner', sa.String(length=200), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    with op.batch_alter_table('segments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_segments_kind'), ['kind'], unique=False)
        batch_op.create_index(batch_op.f('ix_segments_status'), ['status'], unique=False)

    op.create_table('sweeps',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('resources', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('mlflow_run_id', sa.String(length=64), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sweeps_status'), ['status'], unique=False)

    op.create_table('attempts',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('segment_key', sa.String(length=64), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('wall_s', sa.Float(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['segment_key'], ['segments.key'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('segment_key', 'number')
    )
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_attempts_segment_key'), ['segment_key'], unique=False)

    op.create_table('checkpoints',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('segment_key', sa.String(length=64), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('tokens', sa.BigInteger(), nullable=False),
    sa.Column('uri', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['segment_key'], ['segments.key'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('segment_key', 'role', 'tokens')
    )
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_checkpoints_segment_key'), ['segment_key'], unique=False)

    op.create_table('observations',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('segment_key', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('N1', sa.BigInteger(), nullable=True),
    sa.Column('D1', sa.BigInteger(), nullable=True),
    sa.Column('D2', sa.BigInteger(), nullable=True),
    sa.Column('D', sa.BigInteger(), nullable=True),
    sa.Column('N2', sa.BigInteger(), nullable=True),
    sa.Column('N_total', sa.BigInteger(), nullable=True),
    sa.Column('n_expert', sa.Integer(), nullable=True),
    sa.Column('topk', sa.Integer(), nullable=True),
    sa.Column('method', sa.String(length=32), nullable=True),
    sa.Column('r', sa.Float(), nullable=True),
    sa.Column('loss', sa.Float(), nullable=False),
    sa.Column('trunk', sa.String(length=64), nullable=False),
    sa.Column('mlflow_run_id', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['segment_key'], ['segments.key'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('segment_key')
    )
    with op.batch_alter_table('observations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_observations_kind'), ['kind'], unique=False)

    op.create_table('sweep_segments',
    sa.Column('sweep_id', sa.String(length=32), nullable=False),
    sa.Column('segment_key', sa.String(length=64), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('axes', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['segment_key'], ['segments.key'], ),
    sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('sweep_id', 'segment_key')
    )
    with op.batch_alter_table('sweep_segments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sweep_segments_segment_key'), ['segment_key'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('sweep_segments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sweep_segments_segment_key'))

    op.drop_table('sweep_segments')
    with op.batch_alter_table('observations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_observations_kind'))

    op.drop_table('observations')
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_checkpoints_segment_key'))

    op.drop_table('checkpoints')
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_attempts_segment_key'))

    op.drop_table('attempts')
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sweeps_status'))

    op.drop_table('sweeps')
    with op.batch_alter_table('segments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_segments_status'))
        batch_op.drop_index(batch_op.f('ix_segments_kind'))

    op.drop_table('segments')
