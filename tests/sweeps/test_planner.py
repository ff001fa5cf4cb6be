"""The planner: segment counts, tokens and the saving factor worked out by hand; ids shared across specs; the DAG
shape of every shipped example (docs/conventions.md); rounding to whole steps; LR-search wiring; time estimates.

Strategy: expected numbers come from arithmetic written in the test (step counts, FLOPs per token from
sweeps.sizes), never from running the planner and pasting its output.
"""

import itertools
import json
from pathlib import Path

import pytest
import yaml

from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import critical_path_s, plan, segment_seconds
from upscale.sweeps.segments import DECAY_KINDS, TRUNK_KINDS
from upscale.sweeps.sizes import NAMED_SIZES, dense_params, moe_active_params, moe_total_params, train_flops_per_token
from upscale.sweeps.spec import parse_spec

EXAMPLES = sorted((Path(__file__).parents[2] / "sweeps" / "examples").glob("*.yaml"))


def test_liew_data_grid_by_hand() -> None:
    p = plan(load_spec(EXAMPLES[0].parent / "liew-data-grid.yaml"))
    # One 0.1B dense size; experts {4, 8} x topK {1, 2} = 4 MoE configs; naive only; D1 = D2 = five budgets.
    # A trunk is a chain of 5 pieces, one per branch point: dense_trunk 5 | dense_decay 5 | upcycle 5 D1 x 4 configs
    # = 20 | moe_trunk 20 x 5 = 100 | moe_decay 20 x 5 D2 = 100.
    assert p.by_kind() == {"dense_trunk": 5, "dense_decay": 5, "upcycle": 20, "moe_trunk": 100, "moe_decay": 100}
    assert len(p.segments) == 230

    # Budgets are S_i = 1100 * 2^i steps of 512 x 1024 tokens (i = 0..4); decay = round(0.1 S_i) = 110 * 2^i steps,
    # so decay starts at 990 * 2^i. A trunk's pieces run between consecutive starts, to 990 * 16 = 15,840 steps; its
    # five branches add 110 * (1+2+4+8+16) = 3,410 steps: 19,250 steps per trunk+branches (dense, and each of the 20
    # MoE trunks).
    tps = 512 * 1024
    starts = [0] + [990 * 2**i * tps for i in range(5)]
    pieces = [s for s in p.segments if s.spec.kind == "dense_trunk"]
    assert [(t.spec.start_tokens, t.spec.end_tokens) for t in pieces] == list(itertools.pairwise(starts))
    assert [t.spec.parent_ids for t in pieces[1:]] == [(t.id,) for t in pieces[:-1]]  # each from the one before
    assert all(t.spec.save_at_tokens == () and t.trunk == pieces[0].id for t in pieces)
    assert sum(t.tokens for t in pieces) == 15_840 * tps
    decays = [s for s in p.segments if s.spec.kind == "dense_decay"]
    assert [(d.spec.start_tokens, d.spec.end_tokens) for d in decays] == [
        (990 * 2**i * tps, 1100 * 2**i * tps) for i in range(5)]
    assert [d.spec.parent_ids for d in decays] == [(t.id,) for t in pieces]  # the piece ending at its decay start
    assert {d.trunk for d in decays} == {pieces[0].id}  # one trunk for the bootstrap
    assert sum(s.tokens for s in p.segments if s.spec.kind.startswith("dense")) == 19_250 * tps
    assert sum(s.tokens for s in p.segments if s.spec.kind.startswith("moe")) == 20 * 19_250 * tps

    shape = NAMED_SIZES["0.1B"]
    f_d = train_flops_per_token(shape, dense_params(shape), 1024, 32000)
    f_c = [train_flops_per_token(shape, moe_active_params(shape, e, k), 1024, 32000) for e in (4, 8) for k in (1, 2)]
    # Ours: the dense trunk+branches once, and per config 5 upcycles (one per D1) each with an MoE trunk+branches.
    ours = tps * 19_250 * (f_d + 5 * sum(f_c))
    # Independent: each dense point trains D1 (sum of budgets = 1100 * 31 = 34,100 steps); each of the 25 upcycled
    # points per config trains D1 dense then D2 MoE: 5 * 34,100 dense + 5 * 34,100 MoE steps per config.
    independent = tps * 34_100 * (f_d + 4 * 5 * f_d + 5 * sum(f_c))
    assert p.total_flops == pytest.approx(ours, rel=1e-12)
    assert p.independent_flops == pytest.approx(independent, rel=1e-12)
    assert p.saving == pytest.approx(34_100 * (21 * f_d + 5 * sum(f_c)) / (19_250 * (f_d + 5 * sum(f_c))))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_plans_into_a_shared_trunk_dag(path: Path) -> None:
    spec = load_spec(path)
    p = plan(spec)
    seen: dict[str, str] = {}
    by_id = {}
    for s in p.segments:
        assert s.id == s.spec.id and s.id not in seen
        assert all(q in seen for q in s.spec.parent_ids), f"{s.spec.kind} listed before a parent"
        seen[s.id] = s.spec.kind
        if s.spec.kind in DECAY_KINDS:  # from the piece of its trunk that ends at its decay start
            (piece,) = (by_id[q] for q in s.spec.parent_ids)
            assert s.observation is not None and piece.spec.kind in TRUNK_KINDS and piece.trunk == s.trunk
            assert piece.spec.end_tokens == s.spec.start_tokens
        else:
            assert s.observation is None
        if s.spec.kind == "upcycle":  # the dense trunk it descends from, for bootstrapping by trunk
            assert s.trunk == by_id[s.spec.parent_ids[0]].trunk
        by_id[s.id] = s
    first_pieces = [s for s in p.segments if s.spec.kind == "dense_trunk" and s.trunk == s.id]
    assert len(first_pieces) == len(spec.model.sizes)  # one shared trunk per dense size
    assert sum(p.by_kind().values()) == len(p.segments)
    assert 1 < p.saving < 10 and p.total_flops > 0
    assert critical_path_s(p, segment_seconds(p)) > 0


def test_observation_axes_and_r_only_for_drop(spec_data: dict) -> None:
    spec_data["upcycling"] = {"methods": ["naive", "drop"], "r": [0.25, 0.5]}
    p = plan(parse_spec(spec_data))
    # Per D1: naive once (it ignores r) + drop at two r = 3 upcycles; 2 D1 -> 6 upcycles, 6 MoE trunks of 2 pieces
    # (one per D2 branch point), 12 branches.
    assert p.by_kind() == {"dense_trunk": 2, "dense_decay": 2, "upcycle": 6, "moe_trunk": 12, "moe_decay": 12}
    shape = NAMED_SIZES["nano"]
    obs = [s.observation for s in p.observations() if s.observation.kind == "upcycled"]
    assert {(o.method, o.r) for o in obs} == {("naive", None), ("drop", 0.25), ("drop", 0.5)}
    o = obs[0]
    assert (o.N1, o.N2, o.N_total) == (dense_params(shape), moe_active_params(shape, 4, 2), moe_total_params(shape, 4))
    assert (o.D1, o.D2, o.D, o.n_expert, o.topk) == (20480, 20480, None, 4, 2)
    dense = [s.observation for s in p.observations() if s.observation.kind == "dense"]
    assert [(d.D1, d.D) for d in dense] == [(20480, 20480), (40960, 40960)]
    moe_decay = next(s for s in p.segments if s.spec.kind == "moe_decay")
    assert moe_decay.axes | {"sweep": None} == {"sweep": None, "kind": "moe_decay", "size": "nano",
                                                "N1": dense_params(shape), "n_expert": 4, "topk": 2,
                                                "method": "naive", "r": None, "D1": 20480, "D2": 20480, "D": None}


def test_split_methods_train_narrower_experts(spec_data: dict) -> None:
    spec_data["upcycling"] = {"methods": ["granular"], "options": {"granular": {"granularity": 2}}}
    p = plan(parse_spec(spec_data))
    shape = NAMED_SIZES["nano"]  # 2 layers, d_model 32, d_ff 128
    obs = p.observations()[-1].observation
    # Granularity 2: 4 experts of width 64, top-2 -> the active FFN is 2 x 64 = one dense FFN; the only extra active
    # params are the routers (4 x 32 per layer). In total 4 experts of 3 x 32 x 64 = 2 dense FFNs per layer.
    n1 = dense_params(shape)
    assert (obs.N2, obs.N_total) == (n1 + 2 * 4 * 32, n1 + 2 * (3 * 32 * 128 + 4 * 32))
    moe_decay = next(s for s in p.segments if s.spec.kind == "moe_decay")
    assert moe_decay.flops == moe_decay.tokens * train_flops_per_token(shape, obs.N2, 128, 256)


def test_overlapping_specs_share_segment_ids(spec_data: dict) -> None:
    small = plan(parse_spec(spec_data))
    spec_data["name"] = "bigger"
    spec_data["moe"] = {"experts": [4, 8], "topk": [1, 2]}
    spec_data["upcycling"]["methods"] = ["naive", "drop"]
    spec_data["model"]["sizes"] = ["nano", "micro"]
    big = plan(parse_spec(spec_data))
    small_ids = {s.id for s in small.segments}
    assert small_ids < {s.id for s in big.segments}
    # The sweep name is a tag, not identity: renaming changes no id.
    assert [s.id for s in plan(parse_spec({**spec_data, "name": "renamed"})).segments] == [s.id for s in big.segments]


def test_yaml_and_json_give_the_same_ids(spec_data: dict, tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps(spec_data))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec_data))
    from_yaml_text = load_spec(yaml.safe_dump(spec_data).replace("20480", "2.048e4"))  # floats from YAML hash as ints
    ids = [[s.id for s in plan(spec).segments] for spec in
           (load_spec(tmp_path / "s.json"), load_spec(str(tmp_path / "s.yaml")), from_yaml_text, parse_spec(spec_data))]
    assert ids[0] == ids[1] == ids[2] == ids[3]


def test_budgets_round_to_nearest_whole_step(spec_data: dict) -> None:
    # tokens per step = 16 x 128 = 2048. 20000 / 2048 = 9.77 -> 10 steps; 29696 / 2048 = 14.5 -> 15 (half up).
    spec_data["tokens"]["d1"] = [20000, 29696]
    spec_data["train"]["decay"] = {"fraction": 0.25}
    p = plan(parse_spec(spec_data))
    decays = [s.spec for s in p.segments if s.spec.kind == "dense_decay"]
    # decay = round(0.25 x 10) = round(2.5) = 3 steps (half up) -> starts at step 7; round(0.25 x 15) = 4 -> step 11
    assert [(d.decay_start_tokens, d.end_tokens) for d in decays] == [(7 * 2048, 10 * 2048), (11 * 2048, 15 * 2048)]
    assert p.notes == ("tokens.d1[0] (nano): 20000 -> 20480 tokens (10 steps of 2048)",
                       "tokens.d1[1] (nano): 29696 -> 30720 tokens (15 steps of 2048)")
    # Warmup is rounded too (4096 = 2 steps exactly) and stored in tokens in every segment's schedule.
    assert {s.spec.schedule.warmup_tokens for s in p.segments if s.spec.schedule} == {4096}


def test_lr_search_segments_feed_the_trunks(spec_data: dict) -> None:
    del spec_data["train"]["lr"]
    spec_data["train"]["lr_search"] = {"trials": 4, "low": 1e-4, "high": 1e-2, "tokens": 10240}
    spec_data["tokens"]["scratch"] = [20480]
    p = plan(parse_spec(spec_data))
    by_id = {s.id: s for s in p.segments}
    searches = [s for s in p.segments if s.spec.kind == "lr_search"]
    assert sorted(s.axes["family"] for s in searches) == ["dense", "moe"]  # one per model: dense, and the 4x2 MoE
    for trunk in (s for s in p.segments if s.spec.kind in TRUNK_KINDS and s.trunk == s.id):  # a chain's first piece
        assert trunk.spec.optim.lr is None
        family = "dense" if trunk.spec.kind == "dense_trunk" else "moe"
        assert [by_id[q].axes["family"] for q in trunk.spec.parent_ids if by_id[q].spec.kind == "lr_search"] == [family]
    dense_search = next(s for s in searches if s.axes["family"] == "dense")
    shape = NAMED_SIZES["nano"]
    # 4 trials x 10240 tokens (5 steps) each, at the dense FLOPs per token.
    assert dense_search.flops == 4 * 10240 * train_flops_per_token(shape, dense_params(shape), 128, 256)


def test_time_estimate_and_critical_path(spec_data: dict) -> None:
    p = plan(parse_spec(spec_data))
    seconds = segment_seconds(p, tokens_per_s=1000.0)
    trunk = next(s for s in p.segments if s.spec.kind == "dense_trunk")
    decay = next(s for s in p.segments if s.spec.kind == "dense_decay")
    # The trunk's first piece runs to the first decay start: budget 10 steps - round(0.1 x 10) = 9 steps of 2048
    # tokens, at 1000 tokens/s, + 1 s overhead. The first decay (10 steps, decay 1 step) also evaluates 65536
    # held-out tokens at a third of the training cost per token.
    assert seconds[trunk.id] == pytest.approx(9 * 2048 / 1000 + 1.0)
    assert seconds[decay.id] == pytest.approx((2048 + 65536 / 3) / 1000 + 1.0)
    # With one second per segment the longest chain is the two dense pieces -> dense_decay(20) -> upcycle -> the two
    # MoE pieces -> moe_decay: longer in segments than one uncut trunk, the same in tokens.
    assert critical_path_s(p, dict.fromkeys(seconds, 1.0)) == 7.0
