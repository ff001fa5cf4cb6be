"""Expansion (docs/methods.md, "Expansion"): E -> m·E experts with top-k kept. Parameter counts; the parent's function
exactly kept where the routing must keep it (zero noise, r = 0, top-1 with weight 1) and not where it need not
(top-2); copies by utility; Drop-Upcycling on the replicas; the router bias carried with its noise; bad input named."""

from __future__ import annotations

import math

import pytest
import torch

from upscale.sweeps.segments import ExpandSpec
from upscale.workers.errors import WorkerError, validated
from upscale.workers.model import ModelConfig, build_model
from upscale.workers.upcycling import expand
from upscale.workers.upcycling.adapter import bias_of, experts_of, router_of
from upscale.workers.upcycling.expansion import copies
from upscale.workers.weights import instantiate


def spec(**options: object) -> ExpandSpec:
    return validated(ExpandSpec, **options)


def parent_of(dense_cfg: ModelConfig, **moe: object) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A 4-expert MoE of the fixture's trunk with random (so distinct) experts."""
    cfg = dense_cfg.updated(**{"n_expert": 4, "topk": 1, **moe})
    return cfg, build_model(cfg, seed=3).state_dict()


def logits(cfg: ModelConfig, sd: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return instantiate(cfg, sd).eval()(tokens)[0]


@pytest.mark.parametrize("factor", [2, 3])
def test_parameter_counts(dense_cfg: ModelConfig, factor: int) -> None:
    parent_cfg, parent_sd = parent_of(dense_cfg, topk=2)
    cfg, sd = expand(parent_sd, parent_cfg, spec(factor=factor, bias_noise=0.0))
    assert (cfg.n_expert, cfg.topk) == (4 * factor, 2)
    parent, child = instantiate(parent_cfg, parent_sd), instantiate(cfg, sd)
    new = (factor - 1) * 4 * cfg.n_layer  # new experts over all layers, each one router row of d_model
    assert child.n_total() - parent.n_total() == new * (3 * cfg.d_model * cfg.d_expert + cfg.d_model)
    assert child.n2() - parent.n2() == new * cfg.d_model  # per token: only the router grows
    assert child.flops_per_token() - parent.flops_per_token() == 6 * new * cfg.d_model


@pytest.mark.parametrize("dispatch", ["grouped", "deepspeed"])
def test_top1_renormalised_keeps_the_function(dense_cfg: ModelConfig, tokens: torch.Tensor, dispatch: str) -> None:
    # The condition: top-1 with weight 1 (routing="softmax_topk"), zero noise, r = 0. Every replica of the parent's
    # chosen expert scores p_e/m, the most of any; the one picked is a copy, weighted 1.
    parent_cfg, parent_sd = parent_of(dense_cfg, dispatch=dispatch)
    cfg, sd = expand(parent_sd, parent_cfg, spec(factor=2, bias_noise=0.0))
    ours, theirs = logits(cfg, sd, tokens), logits(parent_cfg, parent_sd, tokens)
    assert float((ours - theirs).abs().max()) <= 1e-5 * float(theirs.abs().max())


def test_top2_does_not_keep_it(dense_cfg: ModelConfig, tokens: torch.Tensor) -> None:
    # at top-2 both picks are replicas of the parent's first choice: the second expert's share is lost
    parent_cfg, parent_sd = parent_of(dense_cfg, topk=2)
    cfg, sd = expand(parent_sd, parent_cfg, spec(factor=2, bias_noise=0.0))
    assert float((logits(cfg, sd, tokens) - logits(parent_cfg, parent_sd, tokens)).abs().max()) > 1e-3


def test_layout_copies_experts_and_router_rows(dense_cfg: ModelConfig) -> None:
    parent_cfg, parent_sd = parent_of(dense_cfg, topk=2)
    cfg, sd = expand(parent_sd, parent_cfg, spec(factor=3))
    for l in range(cfg.n_layer):
        old, new = experts_of(parent_sd, parent_cfg, l), experts_of(sd, cfg, l)
        rows = router_of(parent_sd, l)["weight"]
        for i in range(cfg.n_expert):  # new expert i is a copy of parent expert i // 3
            assert all(torch.equal(a, b) for a, b in zip(new[i], old[i // 3], strict=True))
            assert torch.equal(router_of(sd, l)["weight"][i], rows[i // 3])


def test_copies_by_utility() -> None:
    assert copies(torch.tensor([0.7, 0.1, 0.1, 0.1]), 2) == [4, 2, 1, 1]  # shares 2.8, .4, .4, .4 of 4 extra
    assert copies(torch.ones(4), 3) == [3, 3, 3, 3]
    plan = copies(torch.tensor([0.0, 0.0, 1.0]), 4)
    assert plan == [1, 1, 10] and sum(plan) == 12


def test_utility_strategy_follows_the_router(dense_cfg: ModelConfig, tokens: torch.Tensor) -> None:
    parent_cfg, parent_sd = parent_of(dense_cfg)
    for l in range(parent_cfg.n_layer):  # expert 2's router row dominates: it gets the highest mean score
        parent_sd[f"blocks.{l}.ffn.moe.deepspeed_moe.gate.wg.weight"][2] *= 20
    with pytest.raises(WorkerError, match="calibration tokens"):
        expand(parent_sd, parent_cfg, spec(factor=2, strategy="utility"))
    cfg, sd = expand(parent_sd, parent_cfg, spec(factor=2, strategy="utility", bias_noise=0.0), tokens)
    for l in range(cfg.n_layer):
        rows = router_of(sd, l)["weight"]
        parent_row = router_of(parent_sd, l)["weight"][2]
        assert sum(torch.equal(r, parent_row) for r in rows) > 2  # more than the uniform 2 copies
    ours, theirs = logits(cfg, sd, tokens), logits(parent_cfg, parent_sd, tokens)
    assert float((ours - theirs).abs().max()) <= 1e-5 * float(theirs.abs().max())  # any copy counts keep it


def test_drop_upcycling_composes(dense_cfg: ModelConfig) -> None:
    parent_cfg, parent_sd = parent_of(dense_cfg, topk=2)
    cfg, sd = expand(parent_sd, parent_cfg, spec(factor=2, r=0.5, seed=4))
    f = cfg.d_expert
    for l in range(cfg.n_layer):
        old, new = experts_of(parent_sd, parent_cfg, l), experts_of(sd, cfg, l)
        for e in range(parent_cfg.n_expert):
            first, replica = new[2 * e], new[2 * e + 1]
            assert all(torch.equal(a, b) for a, b in zip(first, old[e], strict=True))  # the first copy is whole
            rows = (replica[0] != old[e][0]).any(1)  # W_gate rows redrawn; shared index sets: the same for all
            assert int(rows.sum()) == math.floor(0.5 * f)
            assert torch.equal((replica[2] != old[e][2]).any(0), rows)
    again = expand(parent_sd, parent_cfg, spec(factor=2, r=0.5, seed=4))[1]
    assert all(torch.equal(sd[k], again[k]) for k in sd)  # seeded


def test_loss_free_bias_is_carried_with_noise_on_replicas(dense_cfg: ModelConfig) -> None:
    parent_cfg, parent_sd = parent_of(dense_cfg, topk=2, balancing="loss_free")
    for l in range(parent_cfg.n_layer):
        parent_sd[f"blocks.{l}.ffn.moe.deepspeed_moe.gate.route_bias"] = torch.tensor([0.1, -0.1, 0.3, 0.0])
    exact = expand(parent_sd, parent_cfg, spec(factor=2, bias_noise=0.0))[1]
    cfg, noisy = expand(parent_sd, parent_cfg, spec(factor=2, bias_noise=0.5))
    assert cfg.balancing == "loss_free"
    for l in range(cfg.n_layer):
        b = bias_of(parent_sd, l)
        assert torch.equal(bias_of(exact, l), b.repeat_interleave(2))
        got = bias_of(noisy, l)
        assert torch.equal(got[0::2], b)  # first copies keep the parent's bias
        assert (got[1::2] != b).all() and float((got[1::2] - b).abs().max()) < 5 * 0.5 * float(b.std())


def test_bad_input_is_named(dense_cfg: ModelConfig, dense_sd: dict) -> None:
    parent_cfg, parent_sd = parent_of(dense_cfg, topk=2)
    with pytest.raises(WorkerError, match=r"^factor: .*greater than or equal to 2"):
        spec(factor=1)
    with pytest.raises(WorkerError, match=r"topk=5 exceeds the parent's n_expert=4"):
        expand(parent_sd, parent_cfg, spec(factor=2), topk=5)
    with pytest.raises(WorkerError, match=r"topk=1 differs from the parent's topk=2"):
        expand(parent_sd, parent_cfg, spec(factor=2), topk=1)
    with pytest.raises(WorkerError, match=r"parent n_expert=0: .* the parent is dense"):
        expand(dense_sd, dense_cfg, spec(factor=2))
    with pytest.raises(WorkerError, match=r"parent checkpoint \(an MoE of n_expert=4\) does not match"):
        expand(dense_sd, parent_cfg, spec(factor=2))  # a dense checkpoint named as the MoE parent
    mlp_cfg, mlp_sd = parent_of(dense_cfg, topk=2, router_type="mlp")
    with pytest.raises(WorkerError, match=r"router_type='mlp'"):
        expand(mlp_sd, mlp_cfg, spec(factor=2))
