"""Model construction on the meta device: the same initial weights, bit for bit, as the path it replaced
(bench/model_build.py keeps that path as its baseline), on any thread count; each expert-parallel rank builds exactly
its slice of the single-process init; DeepSpeed's expert marks and a tied embedding survive the allocation."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, build_model, empty_model
from upscale.workers.parallel import expert_slice

BENCH = Path(__file__).resolve().parents[2] / "bench" / "model_build.py"
BASE = ModelConfig(n_layer=2, d_model=32, n_head=2, vocab_size=64, context=8, init_std=0.03)
CONFIGS = {
    "dense": BASE,
    "dense tied": BASE.updated(tie_embeddings=True, n_kv_head=1),
    "moe 4x2": BASE.updated(n_expert=4, topk=2),
    "moe mixture router, shared expert, grouped": BASE.updated(n_expert=4, topk=1, router_type="mixture",
                                                              n_routers=2, shared_d_ff=16, expert_d_ff=24,
                                                              dispatch="grouped"),
    "moe mlp router": BASE.updated(n_expert=4, topk=2, router_type="mlp", router_init="uniform_0.02"),
}


def _legacy_build():
    spec = importlib.util.spec_from_file_location("model_build_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.legacy_build


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(v, b[k]) for k, v in a.items())


@pytest.mark.parametrize("name", CONFIGS)
def test_same_weights_as_the_previous_construction(name: str) -> None:
    cfg, legacy = CONFIGS[name], _legacy_build()
    state = torch.random.get_rng_state()
    built = build_model(cfg, seed=7).state_dict()
    assert torch.equal(torch.random.get_rng_state(), state)
    assert _same(built, legacy(cfg, 7).state_dict())


def test_thread_count_does_not_change_the_weights() -> None:
    cfg, threads = CONFIGS["moe 4x2"], torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = build_model(cfg, seed=3).state_dict()
        torch.set_num_threads(4)
        assert _same(build_model(cfg, seed=3).state_dict(), one)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("ep_size", [2, 4])
def test_each_expert_parallel_rank_builds_its_slice_of_the_single_process_init(ep_size: int) -> None:
    cfg = CONFIGS["moe 4x2"]
    full = build_model(cfg, seed=5).state_dict()
    for ep_rank in range(ep_size):
        local = build_model(cfg.model_copy(update={"ep_size": ep_size}), seed=5, ep_rank=ep_rank)
        experts = local.blocks[0].ffn.moe.deepspeed_moe.experts.deepspeed_experts
        assert len(experts) == 4 // ep_size  # the other ranks' experts are never built
        assert _same(local.state_dict(), expert_slice(full, cfg, ep_size, ep_rank))
    with pytest.raises(WorkerError, match="ep_rank=2 is outside the expert-parallel group of ep_size=2"):
        build_model(cfg.model_copy(update={"ep_size": 2}), seed=5, ep_rank=2)


def test_allocation_keeps_deepspeed_expert_marks_tied_embeddings_and_rope() -> None:
    cfg = CONFIGS["moe 4x2"].updated(tie_embeddings=True)
    model, reference = empty_model(cfg), build_model(cfg, seed=0, device="meta")
    expert = model.blocks[1].ffn.moe.deepspeed_moe.experts.deepspeed_experts[3].w_down.weight
    assert (expert.allreduce, expert.group_name) == (False, "ep_size_1")  # how DeepSpeed finds expert params
    assert model.lm_head.weight is model.tok_emb.weight
    assert {p.device.type for p in model.parameters()} | {b.device.type for b in model.buffers()} == {"cpu"}
    assert torch.equal(model.rope_cos, reference.rope_cos) and model.rope_cos.abs().max() == 1.0
    model.load_state_dict(build_model(cfg, seed=0).state_dict())  # what a caller with weights does next
    logits, _ = model(torch.zeros(1, 8, dtype=torch.long))
    assert torch.isfinite(logits).all()
