"""Router Upcycling (docs/methods.md, "Router Upcycling"; the paper's §3.2-3.3): m = n routers from the preceding
attention layer.

Checked: shapes; router j's queries are the attention's own (pre-RoPE) queries of head group j; expert keys are the
average attention keys of the group, checked against the keys the dense attention itself computes (a hook on W_K);
heads merge by key similarity (planted pairs recovered); scores are the sum over routers and equal x @ W_effᵀ;
keys pairwise distinct; copies + renormalised top-k reproduce the dense logits; real routing spreads tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, seeded_generator
from upscale.workers.upcycling import method_spec, upcycle
from upscale.workers.upcycling.adapter import router_of
from upscale.workers.upcycling.router_upcycling import head_groups, mixture_router
from upscale.workers.weights import instantiate


@pytest.fixture(scope="module")
def upcycled(dense_cfg: ModelConfig, dense_sd: dict, tokens) -> tuple[ModelConfig, dict]:
    return upcycle(dense_sd, dense_cfg.updated(n_expert=4, topk=2), method_spec("router-upcycling"),
                   calibration_tokens=tokens)


def test_queries_and_keys_come_from_the_attention(upcycled, dense_cfg: ModelConfig, dense_model, tokens) -> None:
    # nano has 2 heads and m = n = 4 routers: each head splits into 2 units of d' = 8 dims, one unit per router
    cfg, sd = upcycled
    assert cfg.router_type == "mixture" and cfg.routers == 4
    d, m = dense_cfg.d_model, 4
    keys_seen: list[torch.Tensor] = []
    hooks = [b.attn.wk.register_forward_hook(lambda _m, _a, out: keys_seen.append(out.reshape(-1, d)))
             for b in dense_model.blocks]
    try:
        with torch.no_grad():
            dense_model(tokens)
    finally:
        for h in hooks:
            h.remove()
    x = torch.randn(5, d, generator=torch.Generator().manual_seed(0))
    for l in range(cfg.n_layer):
        r = router_of(sd, l)
        assert r["queries"].shape == (m, d // m, d) and r["keys"].shape == (4, d // m)
        q = dense_model.blocks[l].attn.wq(x).view(5, m, d // m)  # the attention's queries before RoPE, in m units
        torch.testing.assert_close(torch.einsum("jkd,td->tjk", r["queries"], x), q, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(r["keys"], keys_seen[l].mean(0).view(m, d // m), rtol=1e-5, atol=1e-7)


def test_heads_merge_by_key_similarity() -> None:
    # 8 heads, 4 routers: heads (0,5), (1,4), (2,7), (3,6) have near-parallel average keys
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=gen)
    pairs = [(0, 5), (1, 4), (2, 7), (3, 6)]
    avg = torch.empty(8, 6)
    for p, (a, b) in enumerate(pairs):
        avg[a] = base[p] + 0.01 * torch.randn(6, generator=gen)
        avg[b] = 2 * base[p] + 0.01 * torch.randn(6, generator=gen)  # same direction, other scale
    groups = head_groups(avg, 4, seeded_generator(0, 6))
    assert sorted(tuple(g.tolist()) for g in groups) == sorted(pairs)
    # end to end: W_K = I and inputs whose mean is the planted keys -> each router's query rows are its heads' rows
    d = 48
    mean = avg.reshape(-1)
    x = mean + torch.randn(200, d, generator=gen) * 0.001
    x = x - x.mean(0) + mean
    wq = torch.randn(d, d, generator=gen)
    r = mixture_router(wq, torch.eye(d), x, 4, 8, seeded_generator(0, 6))
    for j, g in enumerate(groups):
        rows = torch.cat([wq[h * 6:(h + 1) * 6] for h in g.tolist()])
        assert torch.equal(r["queries"][j], rows)
        torch.testing.assert_close(r["keys"][j], avg[g].reshape(-1), rtol=1e-5, atol=1e-5)


def test_scores_are_the_sum_over_routers_and_linear(upcycled, dense_cfg: ModelConfig) -> None:
    cfg, sd = upcycled
    router = instantiate(cfg, sd).blocks[1].ffn.moe.deepspeed_moe.gate.wg
    q, k = router.queries.detach(), router.keys.detach()
    x = torch.randn(7, dense_cfg.d_model, generator=torch.Generator().manual_seed(1))
    explicit = torch.zeros(7, 4)
    for i in range(4):
        for j in range(q.shape[0]):
            explicit[:, i] += (x @ q[j].T) @ k[i] / math.sqrt(q.shape[1])  # S_i = Σ_j Q^jᵀ K_i / √d' (Eqs. 7-8)
    with torch.no_grad():
        torch.testing.assert_close(router(x), explicit, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(router(x), x @ router.weight.T, rtol=1e-5, atol=1e-6)


def test_keys_distinct_preservation_and_routing_spread(upcycled, dense_model, tokens) -> None:
    cfg, sd = upcycled
    for l in range(cfg.n_layer):
        keys = router_of(sd, l)["keys"]
        assert torch.cdist(keys, keys)[~torch.eye(4, dtype=torch.bool)].min() > 0
    moe = instantiate(cfg, sd).eval()
    with torch.no_grad():
        assert (moe(tokens)[0] - dense_model(tokens)[0]).abs().max().item() <= 1e-5
    for counts in moe.expert_counts:
        p = counts.float() / counts.sum()
        entropy = -(p[p > 0] * p[p > 0].log()).sum().item()
        assert (counts > 0).sum() >= 2 and entropy > 0.1


def test_bad_input(dense_cfg: ModelConfig, dense_sd: dict, tokens) -> None:
    moe_cfg = dense_cfg.updated(n_expert=4, topk=2)
    with pytest.raises(WorkerError, match="router-upcycling needs calibration tokens"):
        upcycle(dense_sd, moe_cfg, method_spec("router-upcycling"))
    bad = torch.zeros_like(tokens)
    bad[0, 0] = 99
    with pytest.raises(WorkerError, match=r"calibration token ids must be in \[0, 64\); got \[0, 99\]"):
        upcycle(dense_sd, moe_cfg, method_spec("router-upcycling"), calibration_tokens=bad)
    with pytest.raises(WorkerError, match=r"needs n_routers = n_expert .* got n_routers=2, n_expert=4"):
        upcycle(dense_sd, moe_cfg, method_spec("router-upcycling", n_routers=2), calibration_tokens=tokens)
    with pytest.raises(WorkerError, match="n_routers=3 must divide d_model=32"):
        upcycle(dense_sd, dense_cfg.updated(n_expert=3, topk=2), method_spec("router-upcycling"),
                calibration_tokens=tokens)
