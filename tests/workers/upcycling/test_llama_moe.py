"""LLaMA-MoE expert construction (docs/methods.md, "LLaMA-MoE expert construction"): partitions, Identity A, the k = n
oracle, the subset-average identity for the chosen (renormalised weights, s folded into W_down) convention, and the
data-driven splits.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, seeded_generator
from upscale.workers.upcycling import method_spec, upcycle
from upscale.workers.upcycling.adapter import FFN, dense_ffn, experts_of, router_of, shared_of
from upscale.workers.upcycling.calibration import ffn_importance, sequence_groups
from upscale.workers.upcycling.llama_moe import clustering_split, random_split, sharing_inner, sharing_inter
from upscale.workers.weights import instantiate


def swiglu(ffn: FFN, x: torch.Tensor) -> torch.Tensor:
    g, u, d = ffn
    return F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d)


def assert_partition(sets: list[torch.Tensor], f: int, n: int) -> None:
    assert [len(s) for s in sets] == [f // n] * n
    assert torch.equal(torch.cat(sets).sort().values, torch.arange(f))


def test_random_split_is_a_balanced_partition() -> None:
    sets = random_split(128, 4, seeded_generator(0, 4, 0))
    assert_partition(sets, 128, 4)
    assert not torch.equal(sets[0], torch.arange(32))  # shuffled, not contiguous
    assert all(torch.equal(a, b) for a, b in zip(sets, random_split(128, 4, seeded_generator(0, 4, 0)), strict=True))


def test_clustering_split_is_balanced_and_recovers_planted_clusters() -> None:
    # 4 planted directions, 16 noisy rows each, shuffled: balanced k-means must return exactly those groups
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 32, generator=gen) * 5
    truth = torch.arange(4).repeat_interleave(16)[torch.randperm(64, generator=gen)]
    rows = centres[truth] + 0.1 * torch.randn(64, 32, generator=gen)
    sets = clustering_split(rows, 4, seeded_generator(0, 4, 0))
    assert_partition(sets, 64, 4)
    assert sorted(tuple(truth[s].unique().tolist()) for s in sets) == [(0,), (1,), (2,), (3,)]


@pytest.mark.parametrize("split", ["independent-random", "independent-clustering"])
def test_experts_sum_to_the_dense_ffn(dense_cfg: ModelConfig, dense_sd: dict, split: str) -> None:
    cfg, sd = upcycle(dense_sd, dense_cfg.updated(n_expert=4, topk=2), method_spec("llama-moe", split=split))
    assert cfg.d_expert == 32 and cfg.router_type == "mlp"
    assert set(router_of(sd, 0)) == {"proj.weight", "out.weight"}
    x = torch.randn(16, dense_cfg.d_model, generator=torch.Generator().manual_seed(0)).double()
    for l in range(cfg.n_layer):
        dense = tuple(t.double() for t in dense_ffn(dense_sd, l))
        experts = [(g.double(), u.double(), d.double() / 2.0) for g, u, d in experts_of(sd, cfg, l)]  # undo s = 4/2
        total = sum(swiglu(e, x) for e in experts)
        assert (total - swiglu(dense, x)).abs().max().item() < 1e-12


def test_k_equals_n_with_uniform_gate(dense_cfg: ModelConfig, dense_sd: dict, dense_model, tokens) -> None:
    # zero linear gate -> renormalised weights 1/n each; s = n on W_down gives back the dense FFN exactly; s = n/k = 1
    # (LLaMA-MoE's heuristic at k = n) gives FFN/n
    moe_cfg = dense_cfg.updated(n_expert=4, topk=4)
    spec = method_spec("llama-moe", llama_gate="linear", score_scale=4.0)
    cfg, sd = upcycle(dense_sd, moe_cfg, spec)
    sd = {k: (torch.zeros_like(v) if ".gate.wg." in k else v) for k, v in sd.items()}
    moe = instantiate(cfg, sd).eval()
    x = torch.randn(32, dense_cfg.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ffn = dense_model.blocks[0].ffn(x)
        assert (moe.blocks[0].ffn(x)[0] - ffn).abs().max().item() < 1e-6
        assert (moe(tokens)[0] - dense_model(tokens)[0]).abs().max().item() <= 1e-5
        cfg1, sd1 = upcycle(dense_sd, moe_cfg, method_spec("llama-moe", llama_gate="linear"))
        sd1 = {k: (torch.zeros_like(v) if ".gate.wg." in k else v) for k, v in sd1.items()}
        torch.testing.assert_close(instantiate(cfg1, sd1).eval().blocks[0].ffn(x)[0], ffn / 4, rtol=1e-5, atol=1e-7)


def test_subset_average_identity(dense_sd: dict) -> None:
    # experts carry s = n/k: with unit weights the average over all k-subsets is the dense FFN (so with the
    # renormalised weights 1/k of a uniform gate it is FFN/k; docs/methods.md, "LLaMA-MoE expert construction")
    n, k = 4, 2
    dense = tuple(t.double() for t in dense_ffn(dense_sd, 0))
    sets = random_split(dense[0].shape[0], n, seeded_generator(0, 4, 0))
    experts = [(dense[0][s], dense[1][s], dense[2][:, s] * (n / k)) for s in sets]
    x = torch.randn(8, dense[0].shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    outs = [swiglu(e, x) for e in experts]
    subsets = list(itertools.combinations(range(n), k))
    unit = sum(sum(outs[i] for i in s) for s in subsets) / len(subsets)
    assert (unit - swiglu(dense, x)).abs().max().item() < 1e-12
    single = sum(outs[i] for i in subsets[0])  # one subset alone is not the dense FFN: the identity is an average
    assert (single - swiglu(dense, x)).abs().max().item() > 1e-3


def test_sharing_inner_takes_each_groups_top_neurons() -> None:
    importance = torch.rand(4, 64, generator=torch.Generator().manual_seed(0))
    sets = sharing_inner(importance, 16)
    for i, s in enumerate(sets):
        assert len(s) == 16
        assert importance[i, s].min() > importance[i][~torch.isin(torch.arange(64), s)].max()


def test_sharing_inter_pools_the_most_shared_neurons() -> None:
    # neurons 0..7 are the top neurons of every expert: they must form the residual pool
    importance = torch.rand(3, 32, generator=torch.Generator().manual_seed(0))
    importance[:, :8] += 10
    residual, routed = sharing_inter(importance, 8, 1)
    assert torch.equal(residual, torch.arange(8))
    all_ids = torch.cat([residual, *routed])
    assert [len(r) for r in routed] == [8, 8, 8]
    assert torch.equal(all_ids.sort().values, torch.arange(32))  # residual and routed are disjoint and cover f


def test_importance_is_the_taylor_score(dense_cfg: ModelConfig, dense_sd: dict, dense_model, tokens) -> None:
    # independent oracle: h -> alpha ⊙ h with alpha = 1; dL/dalpha per token is h · dL/dh
    groups = sequence_groups(dense_sd, tokens, 2, seed=0)
    assert sorted(torch.bincount(groups).tolist()) == [4, 4]
    ours = ffn_importance(dense_sd, dense_cfg, tokens, groups, 2)
    batch = tokens[groups == 1]
    alphas = [torch.ones(*batch.shape, dense_cfg.d_ff, requires_grad=True) for _ in range(dense_cfg.n_layer)]
    hooks = [b.ffn.w_down.register_forward_pre_hook(lambda _m, args, a=a: (args[0] * a,))
             for b, a in zip(dense_model.blocks, alphas, strict=True)]
    try:
        logits, _ = dense_model(batch)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss.backward()
    finally:
        for h in hooks:
            h.remove()
    for l, a in enumerate(alphas):
        torch.testing.assert_close(ours[l, 1], a.grad.abs().reshape(-1, dense_cfg.d_ff).mean(0), rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("split", ["sharing-inner", "sharing-inter"])
def test_sharing_splits_end_to_end(dense_cfg: ModelConfig, dense_sd: dict, tokens, split: str) -> None:
    n = 4 if split == "sharing-inner" else 3
    cfg, sd = upcycle(dense_sd, dense_cfg.updated(n_expert=n, topk=2), method_spec("llama-moe", split=split),
                      calibration_tokens=tokens)
    f, m = cfg.d_ff, cfg.d_expert
    assert m == f // (n if split == "sharing-inner" else n + 1)
    groups = sequence_groups(dense_sd, tokens, n, seed=0)
    importance = ffn_importance(dense_sd, dense_cfg, tokens, groups, n)
    dense = dense_ffn(dense_sd, 0)
    ids = [torch.nonzero((dense[0][:, None] == e[0][None]).all(-1))[:, 0] for e in experts_of(sd, cfg, 0)]
    if split == "sharing-inner":
        assert cfg.shared_d_ff == 0
        assert all(torch.equal(a, b) for a, b in zip(ids, sharing_inner(importance[0], m), strict=True))
    else:
        shared = shared_of(sd, 0)
        residual = torch.nonzero((dense[0][:, None] == shared[0][None]).all(-1))[:, 0]
        assert len(residual) == cfg.shared_d_ff == m
        assert torch.equal(torch.cat([residual, *ids]).sort().values, torch.arange(f))
        torch.testing.assert_close(shared[2], dense[2][:, residual], rtol=0, atol=0)  # no score scale on residual
    with pytest.raises(WorkerError, match=f"llama-moe {split} needs calibration tokens"):
        upcycle(dense_sd, dense_cfg.updated(n_expert=n, topk=2), method_spec("llama-moe", split=split))


@pytest.mark.parametrize(
    ("n", "split", "message"),
    [
        (3, "independent-random", r"n_expert=3 equal parts, which does not divide 128"),
        (4, "sharing-inter", r"n_expert \+ n_residual = 4 \+ 1 = 5 equal parts, which does not divide 128"),
    ],
)
def test_expert_count_must_divide_the_ffn(dense_cfg: ModelConfig, dense_sd: dict, n: int, split: str,
                                          message: str) -> None:
    with pytest.raises(WorkerError, match=message):
        upcycle(dense_sd, dense_cfg.updated(n_expert=n, topk=2), method_spec("llama-moe", split=split))


def test_default_score_scale_is_n_over_k(dense_cfg: ModelConfig, dense_sd: dict) -> None:
    cfg, sd = upcycle(dense_sd, dense_cfg.updated(n_expert=8, topk=2), method_spec("llama-moe"))
    dense = dense_ffn(dense_sd, 0)
    for g, _, d in experts_of(sd, cfg, 0):
        idx = torch.nonzero((dense[0][:, None] == g[None]).all(-1))[:, 0]
        torch.testing.assert_close(d, dense[2][:, idx] * 4.0, rtol=0, atol=0)


@pytest.mark.parametrize(("gate_init", "want_init"), [("official", "normal_0.02"), ("model", "normal_2_5d")])
def test_gate_init_official_by_default(dense_cfg: ModelConfig, dense_sd: dict, gate_init: str, want_init: str) -> None:
    n = 8
    spec = method_spec("llama-moe", **({} if gate_init == "official" else {"llama_gate_init": gate_init}))
    cfg, sd = upcycle(dense_sd, dense_cfg.updated(n_expert=n, topk=2), spec)
    assert cfg.router_init == want_init
    # both gate layers over all layers: N(0, 0.02^2) officially, N(0, 2/(5 cols)) (std ~0.22 on the n x n layer) else
    out = torch.cat([sd[f"blocks.{l}.ffn.moe.deepspeed_moe.gate.wg.out.weight"].flatten()
                     for l in range(cfg.n_layer)])
    proj = torch.cat([sd[f"blocks.{l}.ffn.moe.deepspeed_moe.gate.wg.proj.weight"].flatten()
                      for l in range(cfg.n_layer)])
    want_out = 0.02 if gate_init == "official" else math.sqrt(2 / (5 * n))
    want_proj = 0.02 if gate_init == "official" else math.sqrt(2 / (5 * dense_cfg.d_model))
    assert abs(out.std().item() / want_out - 1) < 0.25  # 128 draws: ~4 standard errors
    assert abs(proj.std().item() / want_proj - 1) < 0.1
