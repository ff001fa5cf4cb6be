"""`moe.balancing` in a sweep spec: it reaches every MoE segment's model and no dense one, leaves every key as it was
at its default, changes the MoE keys when set, and the combination that cannot train the router is refused by name."""

import pytest

from upscale.sweeps.planner import plan
from upscale.sweeps.spec import SpecError, parse_spec


def moe_models(p) -> dict[str, object]:
    return {s.id: s.spec.model for s in p.segments if s.spec.model is not None and s.spec.model.is_moe}


def test_balancing_reaches_the_moe_segments_only(spec_data: dict) -> None:
    before = plan(parse_spec(spec_data))
    spec_data["moe"] |= {"balancing": "aux_loss", "balancing_rate": 1e-3}  # the defaults, spelled out
    assert {s.id for s in plan(parse_spec(spec_data)).segments} == {s.id for s in before.segments}
    spec_data["moe"] |= {"balancing": "loss_free", "balancing_rate": 0.01}
    after = plan(parse_spec(spec_data))
    models = moe_models(after)
    assert models and all((m.balancing, m.balancing_rate) == ("loss_free", 0.01) for m in models.values())
    dense = [s for s in after.segments if s.spec.kind.startswith("dense")]
    assert dense and all(s.spec.model.balancing == "aux_loss" for s in dense)
    assert {s.id for s in dense} <= {s.id for s in before.segments}  # the dense trunk is shared
    assert not set(models) & {s.id for s in before.segments}  # the MoE segments are new computations


def test_loss_free_top1_softmax_topk_is_refused_by_name(spec_data: dict) -> None:
    spec_data["moe"] |= {"topk": [1, 2], "balancing": "loss_free"}
    with pytest.raises(SpecError, match=r"balancing.*without gradient"):
        parse_spec(spec_data)
    spec_data["moe"] |= {"routing": "deepspeed"}
    assert parse_spec(spec_data).moe.balancing == "loss_free"
