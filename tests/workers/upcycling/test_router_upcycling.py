"""Router Upcycling (METHODS.md §5): a mixture of m routers from the preceding attention layer.

Checked: shapes; router j's queries are the W_Q rows of head group j (the attention's own per-head queries, no
RoPE); keys are W_K applied to cluster means of the router inputs (planted clusters recover them exactly) and
pairwise distinct; scores are the sum over routers and equal x @ W_effᵀ; copies + renormalised top-k reproduce the
dense logits; real routing spreads tokens over several experts.
"""

from __future__ import annotations

import math

import pytest
import torch

from workers.errors import WorkerError
from workers.model import ModelConfig, seeded_generator
from workers.upcycling import method_spec, upcycle
from workers.upcycling.adapter import attention, router_of
from workers.upcycling.calibration import ffn_inputs
from workers.upcycling.router_upcycling import mixture_router
from workers.weights import instantiate


@pytest.fixture(scope="module")
def upcycled(dense_cfg: ModelConfig, dense_sd: dict, tokens) -> tuple[ModelConfig, dict]:
    return upcycle(dense_sd, dense_cfg.updated(n_expert=4, topk=2), method_spec("router-upcycling"),
                   calibration_tokens=tokens)


def test_shapes_and_queries_are_head_groups(upcycled, dense_cfg: ModelConfig, dense_sd: dict, dense_model) -> None:
    cfg, sd = upcycled
    assert cfg.router_type == "mixture" and cfg.routers == 4
    r = router_of(sd, 0)
    d, m = dense_cfg.d_model, 4
    assert r["queries"].shape == (m, d // m, d) and r["keys"].shape == (4, m, d // m)
    x = torch.randn(5, d, generator=torch.Generator().manual_seed(0))
    q = dense_model.blocks[0].attn.wq(x).view(5, m, d // m)  # the attention's queries before RoPE, split in m
    torch.testing.assert_close(torch.einsum("jkd,td->tjk", r["queries"], x), q, rtol=1e-6, atol=1e-7)


def test_scores_are_the_sum_over_routers_and_linear(upcycled, dense_cfg: ModelConfig) -> None:
    cfg, sd = upcycled
    router = instantiate(cfg, sd).blocks[1].ffn.moe.deepspeed_moe.gate.wg
    q, k = router.queries.detach(), router.keys.detach()
    x = torch.randn(7, dense_cfg.d_model, generator=torch.Generator().manual_seed(1))
    explicit = torch.zeros(7, 4)
    for i in range(4):
        for j in range(q.shape[0]):
            explicit[:, i] += (x @ q[j].T) @ k[i, j] / math.sqrt(q.shape[1])
    with torch.no_grad():
        torch.testing.assert_close(router(x), explicit, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(router(x), x @ router.weight.T, rtol=1e-5, atol=1e-6)


def test_keys_are_cluster_means_of_projected_inputs() -> None:
    # router inputs from 4 planted blobs: the keys must be W_K·(blob mean), one blob per expert, no position term
    gen = torch.Generator().manual_seed(0)
    d, n = 16, 4
    centres = torch.randn(n, d, generator=gen) * 5
    truth = torch.arange(n).repeat(25)
    x = centres[truth] + 0.05 * torch.randn(100, d, generator=gen)
    wq, wk = torch.randn(d, d, generator=gen), torch.randn(d, d, generator=gen)
    r = mixture_router(wq, wk, x, n, 2, seeded_generator(0, 6))
    expected = torch.stack([x[truth == i].mean(0) @ wk.T for i in range(n)])
    got = r["keys"].reshape(n, d)
    order = [int(torch.cdist(got[i:i + 1], expected).argmin()) for i in range(n)]
    assert sorted(order) == list(range(n))
    torch.testing.assert_close(got, expected[order], rtol=1e-5, atol=1e-5)


def test_keys_distinct_preservation_and_routing_spread(upcycled, dense_cfg: ModelConfig, dense_sd: dict,
                                                       dense_model, tokens) -> None:
    cfg, sd = upcycled
    for l in range(cfg.n_layer):
        keys = router_of(sd, l)["keys"].reshape(4, -1)
        assert torch.cdist(keys, keys)[~torch.eye(4, dtype=torch.bool)].min() > 0
    moe = instantiate(cfg, sd).eval()
    with torch.no_grad():
        assert (moe(tokens)[0] - dense_model(tokens)[0]).abs().max().item() <= 1e-5
    for counts in moe.expert_counts:
        p = counts.float() / counts.sum()
        entropy = -(p[p > 0] * p[p > 0].log()).sum().item()
        assert (counts > 0).sum() >= 2 and entropy > 0.1
    # the router sees the FFN input: its logits on those inputs are the argmax source of the counts above
    inputs = ffn_inputs(dense_sd, dense_cfg, tokens)
    assert inputs[0].shape == (tokens.numel(), dense_cfg.d_model)


def test_needs_calibration_tokens_and_valid_router_count(dense_cfg: ModelConfig, dense_sd: dict, tokens) -> None:
    moe_cfg = dense_cfg.updated(n_expert=4, topk=2)
    with pytest.raises(WorkerError, match="router-upcycling needs calibration tokens"):
        upcycle(dense_sd, moe_cfg, method_spec("router-upcycling"))
    bad = torch.zeros_like(tokens)
    bad[0, 0] = 99
    with pytest.raises(WorkerError, match=r"calibration token ids must be in \[0, 64\); got \[0, 99\]"):
        upcycle(dense_sd, moe_cfg, method_spec("router-upcycling"), calibration_tokens=bad)
    with pytest.raises(WorkerError, match="n_routers=3 must divide d_model=32"):
        upcycle(dense_sd, moe_cfg, method_spec("router-upcycling", n_routers=3), calibration_tokens=tokens)


def test_attention_helper_reads_the_dense_projection(dense_sd: dict) -> None:
    assert torch.equal(attention(dense_sd, 1, "wk"), dense_sd["blocks.1.attn.wk.weight"])
