"""Stored segment configs say what they computed before routing and the LLaMA-MoE gate init were named choices: a
top-1 MoE model without `routing` ran DeepSpeed's gate (`routing: deepspeed`), and a llama-moe upcycle without
`llama_gate_init` drew its gate from the model's router init (`llama_gate_init: model`). Both values are left out
of a segment's identity where they reproduce the old computation (sweeps/segments.py `identity_omits`), so every
stored key stays the fingerprint of its config and pending segments of an older store still train as planned.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 12:00:00
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

_segments = sa.table('segments', sa.column('key', sa.String), sa.column('config', sa.JSON))


def _as_before(config: dict[str, Any]) -> bool:
    """Fill in the old behaviour where ``config`` predates the fields; whether anything changed."""
    changed = False
    model = config.get("model") or {}
    if model.get("n_expert", 0) > 0 and model.get("topk") == 1 and "routing" not in model:
        model["routing"] = "deepspeed"
        changed = True
    upcycle = config.get("upcycle") or {}
    if upcycle.get("method") == "llama-moe" and "llama_gate_init" not in upcycle:
        upcycle["llama_gate_init"] = "model"
        changed = True
    return changed


def upgrade() -> None:
    conn = op.get_bind()
    for key, config in conn.execute(sa.select(_segments.c.key, _segments.c.config)).all():
        if config and _as_before(config):
            conn.execute(sa.update(_segments).where(_segments.c.key == key).values(config=config))


def downgrade() -> None:
    """Nothing to undo: the filled-in values are the old behaviour, and code from before 0007 cannot read configs
    written since (they name the new fields) whatever this does."""
