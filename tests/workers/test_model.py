"""The model: shapes, exact parameter/FLOP counts against the paper (meta device), seeding, routing, bad input.

Counts are checked three ways: against Table 3 to the parameter, against the leading terms of Eqs. 4-6, and
(FLOPs) against torch's own FLOP counter on a real forward + backward.
"""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch.utils.flop_counter import FlopCounterMode

from tests.sweeps.test_sizes import TABLE_3  # the paper's N_dense and N_total (8 experts)
from upscale.sweeps import sizes
from upscale.sweeps.segments import ModelSpec
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, build_model


@pytest.mark.parametrize("size", TABLE_3)
def test_parameter_counts_match_table_3_and_eqs_4_to_6(size: str) -> None:
    n_dense, n_total_8 = TABLE_3[size]
    dense = build_model(ModelConfig.from_size(size), seed=0, device="meta")
    moe = build_model(ModelConfig.from_size(size, n_expert=8, topk=2), seed=0, device="meta")
    assert dense.n1() == dense.n2() == dense.n_total() == n_dense
    assert moe.n1() == n_dense and moe.n_total() == n_total_8
    shape = sizes.shape_of(size)
    assert moe.n2() == sizes.moe_active_params(shape, 8, 2)
    ld2 = shape.n_layer * shape.d_model**2
    # Eqs. 4-6 are the leading terms; the exact counts add norms and the router (< 1% at these sizes)
    assert dense.n1() == pytest.approx(16 * ld2, rel=1e-2)
    assert moe.n2() == pytest.approx((4 + 12 * 2) * ld2, rel=1e-2)
    assert moe.n_total() == pytest.approx((4 + 12 * 8) * ld2, rel=1e-2)


def test_flops_per_token_matches_torch_flop_counter() -> None:
    cfg = ModelConfig(n_layer=2, d_model=32, n_head=2, vocab_size=64, context=16)
    model = build_model(cfg, seed=0)
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model(tokens)[0].sum().backward()
    matmul = counter.get_total_flops() / tokens.numel()
    # torch's counter sees every matmul but not CPU's fused SDPA kernel; the formula adds attention scores/values
    # (12·L·d·T) and counts the RMSNorm weights (L·2d + d) as parameters at 6 FLOPs each: equal exactly
    attention = 12 * cfg.n_layer * cfg.d_model * cfg.context
    norms = 6 * (cfg.n_layer * 2 * cfg.d_model + cfg.d_model)
    assert model.flops_per_token() == matmul + attention + norms


def test_same_seed_same_weights_and_global_rng_untouched() -> None:
    cfg = ModelConfig(n_layer=2, d_model=32, n_head=2, vocab_size=64, context=16, n_expert=4, topk=2)
    state = torch.random.get_rng_state()
    a, b, c = (build_model(cfg, seed=s).state_dict() for s in (1, 1, 2))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.attn.wq.weight"], c["blocks.0.attn.wq.weight"])


def test_router_init_statistics() -> None:
    # N(0, 2/(5d)) at d=64: 8x64 = 512 entries per layer, 2 layers -> std within ~5% (3 sigma of the estimate)
    cfg = ModelConfig(n_layer=2, d_model=64, n_head=4, vocab_size=64, context=16, n_expert=64, topk=2)
    model = build_model(cfg, seed=0)
    w = torch.cat([b.ffn.moe.deepspeed_moe.gate.wg.weight.flatten() for b in model.blocks])
    target = (2 / (5 * 64)) ** 0.5
    assert abs(w.std().item() / target - 1) < 0.05 and abs(w.mean().item()) < 3 * target / w.numel() ** 0.5
    cfg02 = cfg.updated(router_init="uniform_0.02")
    w = torch.cat([b.ffn.moe.deepspeed_moe.gate.wg.weight.flatten() for b in build_model(cfg02, seed=0).blocks])
    # a recentred U(-√3σ, √3σ)
    assert abs(w.std().item() / 0.02 - 1) < 0.05 and w.abs().max().item() < 0.02 * 3**0.5 * 1.02


def test_moe_forward_shapes_aux_loss_and_counts() -> None:
    cfg = ModelConfig(n_layer=2, d_model=32, n_head=2, vocab_size=64, context=16, n_expert=4, topk=2)
    model = build_model(cfg, seed=0).eval()
    tokens = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(0))
    logits, aux = model(tokens)
    assert logits.shape == (3, 16, 64)
    # DeepSpeed normalises l_aux so that a uniform router gives 1 per layer; a fresh router is near-uniform
    assert 2 * 0.9 < aux.item() < 2 * 1.5
    assert len(model.expert_counts) == 2 and all(int(c.sum()) == 2 * 48 for c in model.expert_counts)
    assert torch.equal(model(tokens)[0], logits)  # deterministic top-2 (no 2nd-expert sampling) in eval


def test_from_spec_maps_segment_architecture() -> None:
    dense = ModelConfig.from_spec(ModelSpec(n_layer=2, d_model=32, n_head=2, vocab_size=256, context=64))
    assert not dense.is_moe and dense.d_ff == 128 and dense.context == 64 and dense.vocab_size == 256
    moe = ModelConfig.from_spec(
        ModelSpec(n_layer=2, d_model=32, n_head=2, vocab_size=256, context=64, n_expert=8, topk=2, init_std=0.03)
    )
    assert moe.is_moe and (moe.n_expert, moe.topk, moe.init_std) == (8, 2, 0.03)
    assert moe.dense().n_expert == 0 and build_model(moe, 0, "meta").n1() == build_model(dense, 0, "meta").n_total()
    with pytest.raises(ValidationError, match="router_init"):  # one schema: the segment's spec refuses it already
        ModelSpec(n_layer=2, d_model=32, n_head=2, vocab_size=256, context=64, router_init="xavier")


def test_the_config_is_the_segments_spec_plus_unhashed_fields() -> None:
    spec = ModelSpec(n_layer=2, d_model=32, n_head=4, n_kv_head=2, vocab_size=256, context=64, n_expert=8, topk=1,
                     routing="deepspeed", dispatch="deepspeed", norm_eps=1e-6)
    cfg = ModelConfig.from_spec(spec)
    assert isinstance(cfg, ModelSpec) and ModelSpec(**{k: getattr(cfg, k) for k in ModelSpec.model_fields}) == spec
    assert set(ModelConfig.model_fields) - set(ModelSpec.model_fields) == {
        "expert_d_ff", "shared_d_ff", "router_type", "n_routers", "ep_size"}


def test_one_expert_is_refused_not_built_dense() -> None:
    with pytest.raises(WorkerError, match="n_expert=1: an MoE has at least 2 experts"):
        ModelConfig.from_size("nano", n_expert=1, topk=1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"n_expert": 4, "topk": 5}, r"topk=5 is not valid for n_expert=4; valid: 1\.\.4"),
        ({"n_head": 3}, "d_model=32 is not divisible by n_head=3"),
        ({"router_type": "mixture", "n_expert": 4, "topk": 2, "n_routers": 3}, "n_routers=3 must divide d_model=32"),
        ({"n_expert": 4}, r"topk=0 is not valid for n_expert=4"),  # an MoE names its topk; 0 is the dense default
    ],
)
def test_bad_config_is_a_worker_error(fields: dict, message: str) -> None:
    base = {"n_layer": 1, "d_model": 32, "n_head": 2}
    with pytest.raises(WorkerError, match=message):
        ModelConfig.from_size("nano", **fields) if "n_head" not in fields else ModelConfig.from_size(
            "nano", **{**base, **fields}
        )


def test_unknown_size_lists_valid_sizes() -> None:
    with pytest.raises(WorkerError, match="unknown model size 'huge'; valid sizes: nano, micro, tiny, 15M"):
        ModelConfig.from_size("huge")


def test_context_overflow_is_a_worker_error() -> None:
    model = build_model(ModelConfig(n_layer=1, d_model=32, n_head=2, vocab_size=64, context=8), seed=0)
    with pytest.raises(WorkerError, match="sequence length 9 exceeds the model context 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_moe_backward_under_a_single_process_group(dist_group: None) -> None:
    import torch.distributed as dist

    from upscale.workers.distributed import init_single_process

    init_single_process()  # idempotent: the session's group stays
    assert dist.is_initialized() and dist.get_world_size() == 1
    cfg = ModelConfig(n_layer=1, d_model=32, n_head=2, vocab_size=64, context=16, n_expert=4, topk=2)
    model = build_model(cfg, seed=0).train()
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    logits, aux = model(tokens)
    (logits.logsumexp(-1).mean() + cfg.aux_loss_coef * aux).backward()
    router = model.blocks[0].ffn.moe.deepspeed_moe.gate.wg.weight
    experts = [p for n, p in model.named_parameters() if ".deepspeed_experts." in n]
    assert router.grad is not None and router.grad.abs().sum() > 0
    assert sum(int(p.grad is not None and p.grad.abs().sum() > 0) for p in experts) >= 6  # >= 2 experts x 3 matrices


def test_gqa_ffn_width_and_tied_embeddings_count_as_sizes_says() -> None:
    cfg = ModelConfig(n_layer=2, d_model=32, n_head=4, n_kv_head=2, ffn_width=72, tie_embeddings=True,
                      norm_eps=1e-6, vocab_size=64, context=16, n_expert=4, topk=2)
    model = build_model(cfg, seed=0)
    assert model.lm_head.weight is model.tok_emb.weight  # one tensor: trained once, counted once
    assert tuple(model.blocks[0].attn.wk.weight.shape) == (16, 32)
    assert model.blocks[0].attn_norm.eps == 1e-6
    assert model.n1() == sizes.dense_params(cfg.shape) == build_model(cfg.dense(), seed=0, device="meta").n_total()
    assert model.n_total() == sizes.moe_total_params(cfg.shape, 4)
    assert model.n2() == sizes.moe_active_params(cfg.shape, 4, 2)
    logits, _ = model(torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0)))
    assert logits.shape == (2, 16, 64) and torch.isfinite(logits).all()


def test_configs_saved_before_the_shape_fields_load_with_the_old_model() -> None:
    old = {"n_layer": 2, "d_model": 32, "n_head": 2, "vocab_size": 64, "context": 16, "ffn_mult": 4}
    cfg = ModelConfig(**old)
    assert (cfg.d_ff, cfg.kv_heads, cfg.tie_embeddings, cfg.norm_eps) == (128, 2, False, 1e-5)
