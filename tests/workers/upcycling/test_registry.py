"""The registry: one entry point for every method, the seed from the spec, and each bad input a clear WorkerError.

Every method's output loads into `build_model(cfg)` with DeepSpeed's expert-parameter marks intact (docs/methods.md,
pitfall 6: replacing parameters instead of copying in place silently turns experts into data-parallel params).
"""

from __future__ import annotations

from typing import get_args

import pytest
import torch

from upscale.sweeps.segments import Method
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig
from upscale.workers.upcycling import METHODS, method_spec, upcycle
from upscale.workers.weights import instantiate

SPECS = {
    "naive": {},
    "drop": {"r": 0.3},
    "noise": {},
    "llama-moe": {"split": "sharing-inner"},
    "router-upcycling": {},
    "granular": {"granularity": 2},
    "scratch": {},
}


def test_registry_matches_the_sweep_literal() -> None:
    assert set(METHODS) == set(get_args(Method)) == set(SPECS)


@pytest.mark.parametrize("method", SPECS)
def test_every_method_is_seeded_by_spec_and_loads(dense_cfg: ModelConfig, dense_sd: dict, tokens, method: str) -> None:
    moe_cfg = dense_cfg.updated(n_expert=4, topk=2)
    a_cfg, a = upcycle(dense_sd, moe_cfg, method_spec(method, seed=1, **SPECS[method]), tokens)
    _, b = upcycle(dense_sd, moe_cfg, method_spec(method, seed=1, **SPECS[method]), tokens)
    _, c = upcycle(dense_sd, moe_cfg, method_spec(method, seed=2, **SPECS[method]), tokens)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # router-upcycling draws nothing at random (copies; router from the attention weights and data) at this shape
    assert any(not torch.equal(a[k], c[k]) for k in a) == (method != "router-upcycling")
    model = instantiate(a_cfg, a)
    experts = [p for n, p in model.named_parameters() if ".deepspeed_experts." in n]
    assert experts and all(p.allreduce is False and p.group_name == "ep_size_1" for p in experts)
    with torch.no_grad():
        logits, aux = model.eval()(tokens)
    assert torch.isfinite(logits).all() and torch.isfinite(aux)


def test_unknown_method_lists_the_valid_ones() -> None:
    with pytest.raises(WorkerError, match="unknown upcycling method 'sparse'; valid methods: naive, drop, noise, "
                                          "llama-moe, router-upcycling, granular, scratch"):
        method_spec("sparse")


def test_dense_target_and_topk_are_rejected(dense_cfg: ModelConfig, dense_sd: dict) -> None:
    with pytest.raises(WorkerError, match="needs an MoE config"):
        upcycle(dense_sd, dense_cfg, method_spec("naive"))
    with pytest.raises(WorkerError, match=r"topk=5 is not valid for n_expert=4; valid: 1\.\.4"):
        dense_cfg.updated(n_expert=4, topk=5)


def test_wrong_shape_checkpoint_names_the_tensor(dense_cfg: ModelConfig, dense_sd: dict) -> None:
    sd = dict(dense_sd)
    sd["blocks.1.ffn.w_up.weight"] = torch.zeros(64, 32)
    with pytest.raises(WorkerError, match=r"dense checkpoint tensor blocks\.1\.ffn\.w_up\.weight has shape \(64, 32\); "
                                          r"the config expects \(128, 32\)"):
        upcycle(sd, dense_cfg.updated(n_expert=4, topk=2), method_spec("naive"))
    wider = dense_cfg.updated(d_model=64, n_head=2, n_expert=4, topk=2)
    with pytest.raises(WorkerError, match=r"tok_emb\.weight has shape \(64, 32\); the config expects \(64, 64\)"):
        upcycle(dense_sd, wider, method_spec("naive"))


def test_bf16_checkpoint_stays_bf16_with_exact_copies(dense_cfg: ModelConfig, dense_sd: dict, tokens) -> None:
    # statistics and slicing run in fp32; the MoE is written back in the checkpoint's dtype, copies bit-exact
    bf16 = {k: v.to(torch.bfloat16) for k, v in dense_sd.items()}
    moe_cfg = dense_cfg.updated(n_expert=4, topk=2)
    for method in ("naive", "drop", "llama-moe"):
        _, sd = upcycle(bf16, moe_cfg, method_spec(method, r=0.0), tokens)
        assert all(v.dtype == torch.bfloat16 for v in sd.values())
    _, sd = upcycle(bf16, moe_cfg, method_spec("naive"))
    expert = "blocks.0.ffn.moe.deepspeed_moe.experts.deepspeed_experts.3.w_up.weight"
    assert torch.equal(sd[expert], bf16["blocks.0.ffn.w_up.weight"])
