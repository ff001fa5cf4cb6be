"""The DeepSpeed engine: expert parameters in their own optimiser groups, norms undecayed, ZeRO-2 takes the same
steps as stage 0 on CPU, the aux loss reaches the router with its coefficient, a NaN loss stops before the step."""

from __future__ import annotations

import pytest
import torch

from upscale.sweeps.segments import OptimSpec
from upscale.workers.engine import NonFiniteLoss, build_engine, param_groups, train_step
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, build_model

CFG = ModelConfig(n_layer=2, d_model=32, n_head=2, vocab_size=64, context=16, n_expert=4, topk=2)
OPTIM = OptimSpec(lr=1e-3, batch_size=4)


def batch(i: int) -> torch.Tensor:
    return torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(i))


def test_param_groups_split_experts_and_norms(dist_group: None) -> None:
    model = build_model(CFG, seed=0)
    groups = param_groups(model, 0.1)
    expert_ids = {id(p) for n, p in model.named_parameters() if ".deepspeed_experts." in n}
    norm_ids = {id(p) for n, p in model.named_parameters() if n.endswith("norm.weight")}
    moe = [g for g in groups if g.get("moe")]
    assert {id(p) for g in moe for p in g["params"]} == expert_ids
    assert all(g["weight_decay"] == 0.0 for g in groups if any(id(p) in norm_ids for p in g["params"]))
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_zero2_takes_the_same_steps_as_stage0(dist_group: None) -> None:
    e0 = build_engine(build_model(CFG, seed=0), OPTIM, zero_stage=0)
    e2 = build_engine(build_model(CFG, seed=0), OPTIM, zero_stage=2)
    for i in range(3):
        s0 = train_step(e0, batch(i), 1e-3, CFG.aux_loss_coef, "cpu")
        s2 = train_step(e2, batch(i), 1e-3, CFG.aux_loss_coef, "cpu")
        assert s2.loss == pytest.approx(s0.loss, rel=1e-5) and s2.aux_loss == pytest.approx(s0.aux_loss, rel=1e-5)
        assert s2.grad_norm is not None and s2.grad_norm > 0
    a, b = e0.module.state_dict(), e2.module.state_dict()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5


def test_aux_coefficient_only_changes_the_router(dist_group: None) -> None:
    # the aux loss's gradient flows through the routers (and their inputs) but never reaches the LM head
    runs = []
    for coef in (0.0, 1.0):
        eng = build_engine(build_model(CFG, seed=0), OPTIM.model_copy(update={"grad_clip": 0.0}))
        train_step(eng, batch(0), 1e-3, coef, "cpu")
        runs.append(eng.module.state_dict())
    router = "blocks.0.ffn.moe.deepspeed_moe.gate.wg.weight"
    assert not torch.equal(runs[0][router], runs[1][router])
    assert torch.equal(runs[0]["lm_head.weight"], runs[1]["lm_head.weight"])


def test_non_finite_loss_raises_before_the_step(dist_group: None) -> None:
    eng = build_engine(build_model(CFG.dense(), seed=0), OPTIM)
    before = {k: v.clone() for k, v in eng.module.state_dict().items()}
    with torch.no_grad():
        eng.module.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteLoss, match="loss is nan"):
        train_step(eng, batch(0), 1e-3, 0.0, "cpu")
    after = eng.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if k != "lm_head.weight")


def test_bad_engine_options(dist_group: None) -> None:
    with pytest.raises(WorkerError, match="ZeRO stages 0, 1 and 2"):
        build_engine(build_model(CFG, seed=0), OPTIM, zero_stage=3)
    if not torch.cuda.is_available():
        with pytest.raises(WorkerError, match="CUDA is not available"):
            build_engine(build_model(CFG, seed=0), OPTIM, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_autocast_step_on_cuda() -> None:
    from upscale.workers.distributed import init_single_process

    init_single_process("nccl")
    eng = build_engine(build_model(CFG, seed=0), OPTIM, device="cuda")
    losses = [train_step(eng, batch(0), 3e-3, CFG.aux_loss_coef, "cuda").loss for _ in range(5)]
    assert next(eng.module.parameters()).dtype == torch.float32  # fp32 master weights, bf16 compute
    assert losses[-1] < losses[0]
