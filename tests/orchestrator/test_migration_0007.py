"""Segments stored before routing and the LLaMA-MoE gate init were named choices keep their keys after upgrading:
migration 0007 fills in what they computed (DeepSpeed's top-1 gate, the model's router init for llama-moe gates), so
their configs still hash to their keys and the scheduler trains pending ones instead of refusing them."""

from __future__ import annotations

from alembic import command
from sqlalchemy import create_engine, insert, select

from upscale.orchestrator.records import SegmentRecord
from upscale.orchestrator.store import Store, alembic_config
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import SegmentSpec
from upscale.sweeps.spec import parse_spec

OLD_TOP1 = {"name": "old", "model": {"sizes": ["nano"]}, "moe": {"experts": [4], "topk": [1], "routing": "deepspeed"},
            "upcycling": {"methods": ["naive", "llama-moe"]}, "tokens": {"d1": [1024], "d2": [1024]},
            "train": {"context": 16, "batch_size": 4, "lr": {"dense": 0.003, "moe": 0.002}, "warmup_tokens": 64}}


def _as_stored_before(config: dict) -> dict:
    """``config`` as code from before the fields wrote it: without routing, dispatch and llama_gate_init."""
    out = {k: v for k, v in config.items()}
    if out.get("model"):
        out["model"] = {k: v for k, v in out["model"].items() if k not in ("routing", "dispatch")}
    if out.get("upcycle"):
        out["upcycle"] = {k: v for k, v in out["upcycle"].items() if k != "llama_gate_init"}
    return out


def test_old_top1_and_llama_moe_configs_still_hash_to_their_keys(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0006")
    specs = [p.spec for p in plan(parse_spec(OLD_TOP1)).segments]
    specs = [s.model_copy(update={"upcycle": s.upcycle.model_copy(update={"llama_gate_init": "model"})})
             if s.upcycle is not None and s.upcycle.method == "llama-moe" else s
             for s in specs]  # the model's router init is what the old code drew llama-moe's gate from
    old = {SegmentSpec.model_validate(s.model_dump(mode="json")).id: SegmentSpec.model_validate(
        s.model_dump(mode="json")) for s in specs}
    with engine.begin() as conn:
        for key, spec in old.items():
            conn.execute(insert(SegmentRecord.__table__).values(
                key=key, kind=spec.kind, config=_as_stored_before(spec.model_dump(mode="json")), parents=[],
                status="pending", attempts=0, tokens=0, flops=0.0))
    moe_top1 = [k for k, s in old.items() if s.model.n_expert and s.model.topk == 1]
    assert moe_top1 and any(s.upcycle is not None and s.upcycle.method == "llama-moe" for s in old.values())
    with engine.connect() as conn:  # before the upgrade, old top-1 configs read back as the new routing
        configs = dict(conn.execute(select(SegmentRecord.key, SegmentRecord.config)).all())
    assert any(SegmentSpec.model_validate(configs[k]).id != k for k in moe_top1)

    store = Store(url)  # migrates to head
    with store.transaction() as s:
        rows = s.scalars(select(SegmentRecord)).all()
        assert {r.key for r in rows} == set(old)
        for r in rows:
            assert SegmentSpec.model_validate(r.config).id == r.key
            if r.key in moe_top1:
                assert r.config["model"]["routing"] == "deepspeed"
