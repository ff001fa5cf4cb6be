"""Expert upcycling in the grid: an `expansion` section plans each MoE parent's scratch arm to its D1 budgets, an
expand per (factor, strategy, D1) off that arm's decay, the expanded MoE's trunk and decays at D2, and the m·E MoE
from scratch beside it. Identity as everywhere: shared with the grid's own scratch arm, kept when budgets grow;
bad input is one error per field, at plan time."""

from __future__ import annotations

import copy

import pytest

from upscale.sweeps.errors import SpecError
from upscale.sweeps.memory import memory_plan
from upscale.sweeps.planner import Plan, plan
from upscale.sweeps.run_tags import run_name, segment_params
from upscale.sweeps.segments import SegmentSpec, canonical_json
from upscale.sweeps.sizes import NAMED_SIZES, dense_params, moe_active_params, moe_total_params
from upscale.sweeps.spec import parse_spec, segment_bound

D1 = [20480, 40960]  # 10 and 20 steps of 16 x 128 tokens
D2 = [20480, 40960]


@pytest.fixture
def expanding(spec_data: dict) -> dict:
    """The small spec with one parent 2x1 grown twofold."""
    spec_data["expansion"] = {"parents": [{"n_expert": 2, "topk": 1}], "factors": [2]}
    return spec_data


def ids(p: Plan) -> set[str]:
    return {s.id for s in p.segments}


def of(p: Plan, kind: str, **axes: object) -> list:
    return [s for s in p.segments if s.spec.kind == kind and all(s.axes.get(k) == v for k, v in axes.items())]


def test_the_dag_of_one_parent_grown_twofold(expanding: dict) -> None:
    p = plan(parse_spec(expanding))
    base = plan(parse_spec({k: v for k, v in expanding.items() if k != "expansion"}))
    assert ids(base) < ids(p)  # the dense-upcycling grid is untouched
    added = [s for s in p.segments if s.id not in ids(base)]
    kinds = {k: sum(s.spec.kind == k for s in added) for k in {s.spec.kind for s in added}}
    # parent 2x1: a scratch trunk cut at each D1's decay start (2 pieces) and 2 decays; per D1 an expand, an MoE trunk
    # of 2 pieces and 2 decays; 4x1 from scratch at the totals D1 + D2 = 40960, 61440, 81920: 3 pieces, 3 decays
    assert kinds == {"scratch_trunk": 5, "scratch_decay": 5, "expand": 2, "moe_trunk": 4, "moe_decay": 4}
    parents = {s.id: s for s in of(p, "scratch_decay", n_expert=2, topk=1)}
    assert sorted(s.spec.end_tokens for s in parents.values()) == D1
    for grow in of(p, "expand"):
        (parent,) = grow.spec.parent_ids
        assert parent in parents and grow.axes["D1"] == parents[parent].spec.end_tokens
        assert grow.flops == 0 and grow.tokens == 0 and grow.observation is None
        assert (grow.spec.model.n_expert, grow.spec.model.topk, grow.spec.expand.factor) == (4, 1, 2)
        assert grow.trunk == parents[parent].trunk  # an expand belongs to its parent's trunk, as an upcycle does
        trunk = next(s for s in p.segments if s.spec.kind == "moe_trunk" and grow.id in s.spec.parent_ids)
        assert trunk.spec.model == grow.spec.model and trunk.spec.start_tokens == 0
    assert sorted(s.spec.end_tokens for s in of(p, "scratch_decay", n_expert=4, topk=1)) == [40960, 61440, 81920]
    assert p.independent_flops > base.independent_flops and p.total_flops < p.independent_flops


def test_expanded_observations(expanding: dict) -> None:
    expanding["expansion"] |= {"strategies": ["uniform", "utility"], "r": 0.25}
    p = plan(parse_spec(expanding))
    shape = NAMED_SIZES["nano"]
    obs = [s.observation for s in p.observations() if s.observation.kind == "expanded"]
    assert len(obs) == 2 * len(D1) * len(D2)
    assert {(o.method, o.D1, o.D2) for o in obs} == {(m, a, b) for m in ("expand-uniform", "expand-utility")
                                                     for a in D1 for b in D2}
    o = obs[0]
    assert (o.N1, o.n_expert, o.topk, o.parent_experts, o.r, o.D) == (dense_params(shape), 4, 1, 2, 0.25, None)
    assert (o.N2, o.N_total) == (moe_active_params(shape, 4, 1), moe_total_params(shape, 4))
    scratch = [s.observation for s in p.observations() if s.observation.kind == "scratch"]
    assert {(s.n_expert, s.topk, s.D) for s in scratch} == {(2, 1, 20480), (2, 1, 40960), (4, 1, 40960),
                                                             (4, 1, 61440), (4, 1, 81920)}
    assert {s.N1 for s in scratch} == {o.N1} and all(s.parent_experts is None for s in scratch)
    decay = next(s for s in p.observations() if s.observation.kind == "expanded")
    assert decay.axes["parent_experts"] == 2 and decay.axes["method"] == "expand-uniform"
    expanding["expansion"]["r"] = 0
    assert {s.observation.r for s in plan(parse_spec(expanding)).observations()} == {None}


def test_a_parent_in_the_grid_shares_its_scratch_arm(expanding: dict) -> None:
    expanding["moe"] = {"experts": [2], "topk": [1]}
    expanding["tokens"]["scratch"] = [20480, 40960, 61440, 81920]
    grid = expanding | {"expansion": None}
    without = plan(parse_spec(grid))
    p = plan(parse_spec(expanding))
    assert ids(without) < ids(p)
    parents = {s.spec.parent_ids[0] for s in of(p, "expand")}
    assert parents <= {s.id for s in of(without, "scratch_decay")}
    # tokens.scratch is also the budgets of the expanded MoE from scratch
    assert sorted(s.spec.end_tokens for s in of(p, "scratch_decay", n_expert=4)) == [20480, 40960, 61440, 81920]


@pytest.mark.parametrize("grow", [
    lambda d: d["tokens"]["d2"].append(81920),
    lambda d: d["expansion"]["factors"].append(3),
    lambda d: d["expansion"]["strategies"].append("utility"),
    lambda d: d["expansion"]["parents"].append({"n_expert": 8, "topk": 2}),
])
def test_growing_the_expansion_keeps_every_key(expanding: dict, grow) -> None:
    expanding["expansion"]["strategies"] = ["uniform"]
    expanding["tokens"]["scratch"] = [40960, 81920]
    before = ids(plan(parse_spec(expanding)))
    bigger = copy.deepcopy(expanding)
    grow(bigger)
    assert before < ids(plan(parse_spec(bigger)))


def test_without_scratch_budgets_a_larger_d2_keeps_every_key(expanding: dict) -> None:
    """The m·E arm's budgets are the totals D1 + D2 then: here every new total lies past the old ones."""
    before = ids(plan(parse_spec(expanding)))
    expanding["tokens"]["d2"].append(81920)
    assert before < ids(plan(parse_spec(expanding)))


def test_existing_segments_keep_their_keys() -> None:
    """`expand` is absent from the fingerprint of every other segment: adding it re-keyed nothing."""
    spec = SegmentSpec.model_validate({"kind": "upcycle", "model": {"n_layer": 2, "d_model": 32, "n_head": 2,
                                       "vocab_size": 256, "context": 16, "n_expert": 4, "topk": 1},
                                       "data": {}, "upcycle": {"method": "naive"}})
    assert '"expand"' not in canonical_json(spec)


@pytest.mark.parametrize(("section", "field", "message"), [
    ({"factors": [1]}, "expansion.factors[0]", "at least doubles"),
    ({"factors": [2, 2]}, "expansion.factors[1]", "listed twice"),
    ({"factors": [4096]}, "expansion.factors[0]", "exceeds 4096"),
    ({"parents": [{"n_expert": 2, "topk": 3}]}, "expansion.parents[0].topk", "valid: 1..2"),
    ({"parents": [{"n_expert": 1, "topk": 1}]}, "expansion.parents[0].n_expert", "a dense parent is upcycled"),
    ({"parents": [{"n_expert": 0, "topk": 0}]}, "expansion.parents[0].n_expert", "a dense parent is upcycled"),
    ({"strategies": ["best"]}, "expansion.strategies[0]", "unknown value"),
    ({"parents": []}, "expansion.parents", "empty list"),
    ({"parents": [{"checkpoint": "runs/moe-4x1"}]}, "expansion.parents[0]", "cannot be a parent"),
    ({"parents": ["runs/moe-4x1"]}, "expansion.parents[0]", "is not an MoE parent this sweep can expand"),
])
def test_bad_expansions_name_their_field(expanding: dict, section: dict, field: str, message: str) -> None:
    expanding["expansion"] |= section
    with pytest.raises(SpecError) as e:
        parse_spec(expanding)
    assert [p for p in e.value.problems if p[0] == field and message in p[1]], e.value.problems


def test_loss_free_top1_parent_is_refused(expanding: dict) -> None:
    expanding["moe"] |= {"balancing": "loss_free"}
    with pytest.raises(SpecError) as e:
        parse_spec(expanding)
    assert [p for p, _ in e.value.problems] == ["expansion.parents[0].topk"]


def test_segment_bound_counts_the_expansion(expanding: dict) -> None:
    for extra in ({}, {"strategies": ["uniform", "utility"], "factors": [2, 4]}):
        expanding["expansion"] |= extra
        spec = parse_spec(expanding)
        assert len(plan(spec).segments) <= segment_bound(spec)
    grid = parse_spec(expanding | {"expansion": None})
    assert segment_bound(spec) - segment_bound(grid) >= len(plan(spec).segments) - len(plan(grid).segments)
    with pytest.raises(SpecError, match=r"expansion\.factors"):
        parse_spec(expanding, max_segments=len(plan(grid).segments))


def test_nothing_shared_the_bound_is_exact(expanding: dict) -> None:
    expanding["tokens"]["d1"] = [20480, 61440]  # totals D1 + D2 all distinct: 40960, 61440, 81920, 102400
    spec = parse_spec(expanding)
    assert segment_bound(spec) == len(plan(spec).segments)


def test_the_memory_check_sizes_the_expanded_moe(expanding: dict) -> None:
    expanding["expansion"]["factors"] = [32]  # 64x1: more weights than the grid's 4x2 has activations
    (size,) = memory_plan(parse_spec(expanding), None)
    assert size.model == "nano as 64x1"


def test_runs_name_the_expansion(expanding: dict) -> None:
    p = plan(parse_spec(expanding))
    grow = of(p, "expand")[0]
    decay = next(s for s in p.observations() if s.observation.kind == "expanded")
    assert run_name(grow.spec, grow.axes).startswith("expanded expand-uniform 4x1 · nano")
    assert run_name(decay.spec, decay.axes).startswith("expanded expand-uniform 4x1 · nano")
    params = segment_params(grow.spec, grow.axes)
    assert (params["method"], params["expand_factor"], params["parent_experts"]) == ("expand-uniform", "2", "2")
    assert segment_params(decay.spec, decay.axes)["method"] == "expand-uniform"


def test_an_lr_search_fixes_the_lr_of_the_parent_and_of_the_expanded_moe(expanding: dict) -> None:
    expanding["train"] = {**expanding["train"], "lr": None,
                          "lr_search": {"trials": 2, "low": 1e-4, "high": 1e-2, "tokens": 20480}}
    p = plan(parse_spec(expanding))
    searches = {(s.axes["n_expert"], s.axes["topk"]): s.id for s in of(p, "lr_search", family="moe")}
    assert {(2, 1), (4, 1)} <= set(searches)
    firsts = [s for s in of(p, "moe_trunk", parent_experts=2) if s.spec.start_tokens == 0]
    assert len(firsts) == len(D1)
    for trunk in firsts:  # after its expand, the search of its config
        assert trunk.spec.optim.lr is None and trunk.spec.parent_ids[1:] == (searches[4, 1],)
    first = [s for s in of(p, "scratch_trunk", n_expert=2) if s.spec.start_tokens == 0]
    assert [s.spec.parent_ids for s in first] == [(searches[2, 1],)]
