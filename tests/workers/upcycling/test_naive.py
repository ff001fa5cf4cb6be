"""Naive upcycling (docs/methods.md, "Naive upcycling"): exact copies, fresh router statistics, and function
preservation.

Oracle: Identity B. With the renormalised top-k (every k under `softmax_topk`, k >= 2 under DeepSpeed's routing) and
no token dropping, copied experts give back the dense FFN, so whole-model logits match the dense model's; DeepSpeed's
top-1 is not renormalised (output = p_max·FFN), the negative control that shows the comparison can fail.
"""

from __future__ import annotations

import math

import pytest
import torch

from upscale.workers.model import ModelConfig, init_router, seeded_generator
from upscale.workers.upcycling import method_spec, upcycle
from upscale.workers.upcycling.adapter import dense_ffn, experts_of
from upscale.workers.weights import instantiate


def test_experts_are_copies_and_the_rest_is_inherited(dense_cfg: ModelConfig, dense_sd: dict) -> None:
    cfg, sd = upcycle(dense_sd, dense_cfg.updated(n_expert=4, topk=2), method_spec("naive"))
    for l in range(cfg.n_layer):
        ffn = dense_ffn(dense_sd, l)
        for expert in experts_of(sd, cfg, l):
            assert all(torch.equal(a, b) for a, b in zip(expert, ffn, strict=True))
    for k, v in dense_sd.items():
        if ".ffn." not in k:
            assert torch.equal(sd[k], v), k


@pytest.mark.parametrize(("init", "std"), [("normal_0.02", 0.02), ("uniform_0.02", 0.02), ("normal_2_5d", None)])
def test_router_statistics(init: str, std: float | None) -> None:
    # 4096 x 64 router: the std estimate has relative error ~1/sqrt(2·262144) = 0.14%; 5% is far outside noise
    cfg = ModelConfig(n_layer=1, d_model=64, n_head=2, vocab_size=64, context=16, n_expert=4096, topk=2,
                      router_init=init)
    w = init_router(cfg, seeded_generator(0, 1, 0))["weight"]
    target = std if std is not None else math.sqrt(2 / (5 * 64))
    assert w.shape == (4096, 64)
    assert abs(w.std().item() - target) < 0.05 * target
    assert abs(w.mean().item()) < 5 * target / math.sqrt(w.numel())


@pytest.mark.parametrize("k", [2, 4])
def test_copies_preserve_the_dense_function(
    dense_cfg: ModelConfig, dense_sd: dict, dense_model, tokens, k: int
) -> None:
    cfg, sd = upcycle(dense_sd, dense_cfg.updated(n_expert=4, topk=k), method_spec("naive", seed=3))
    moe = instantiate(cfg, sd).eval()
    with torch.no_grad():
        x = torch.randn(64, dense_cfg.d_model, generator=torch.Generator().manual_seed(0))
        block_diff = (moe.blocks[0].ffn(x)[0] - dense_model.blocks[0].ffn(x)).abs().max().item()
        logit_diff = (moe(tokens)[0] - dense_model(tokens)[0]).abs().max().item()
    assert block_diff <= 1e-6
    assert logit_diff <= 1e-5


def test_top1_preserves_the_dense_function_under_softmax_topk(dense_cfg: ModelConfig, dense_sd: dict, dense_model,
                                                               tokens) -> None:
    cfg, sd = upcycle(dense_sd, dense_cfg.updated(n_expert=4, topk=1), method_spec("naive"))
    assert cfg.routing == "softmax_topk"  # the default: the chosen expert's weight is 1
    with torch.no_grad():
        logit_diff = (instantiate(cfg, sd).eval()(tokens)[0] - dense_model(tokens)[0]).abs().max().item()
    assert logit_diff <= 1e-5


def test_top1_deepspeed_routing_scales_by_p_max(dense_cfg: ModelConfig, dense_sd: dict, dense_model, tokens) -> None:
    cfg, sd = upcycle(dense_sd, dense_cfg.updated(n_expert=4, topk=1, routing="deepspeed"), method_spec("naive"))
    moe = instantiate(cfg, sd).eval()
    with torch.no_grad():
        x = torch.randn(64, dense_cfg.d_model, generator=torch.Generator().manual_seed(0))
        gate = moe.blocks[0].ffn.moe.deepspeed_moe.gate.wg
        p_max = torch.softmax(gate(x), dim=-1).max(dim=-1, keepdim=True).values
        ffn = dense_model.blocks[0].ffn(x)
        torch.testing.assert_close(moe.blocks[0].ffn(x)[0], p_max * ffn, rtol=1e-5, atol=1e-6)
        logit_diff = (moe(tokens)[0] - dense_model(tokens)[0]).abs().max().item()
    assert p_max.max().item() < 0.9  # a near-uniform fresh router over 4 experts
    assert logit_diff > 1e-3


def test_same_seed_same_router_other_seed_other_router(dense_cfg: ModelConfig, dense_sd: dict) -> None:
    moe_cfg = dense_cfg.updated(n_expert=4, topk=2)
    a, b, c = (upcycle(dense_sd, moe_cfg, method_spec("naive", seed=s))[1] for s in (1, 1, 2))
    key = "blocks.0.ffn.moe.deepspeed_moe.gate.wg.weight"
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a[key], c[key])
