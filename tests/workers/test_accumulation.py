"""Micro-batches and activation checkpointing change memory, not results: a step over N micro-batches has the
gradients of one batch of the same tokens (the load-balancing loss: each micro-batch's own, averaged), and
recomputing each block in the backward pass gives the gradients of keeping its activations."""

from __future__ import annotations

import copy

import pytest
import torch

from upscale.sweeps.segments import OptimSpec
from upscale.workers.engine import build_engine, lm_loss, train_step
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, UpscaleLM, build_model

MOE = ModelConfig(n_layer=2, d_model=32, n_head=2, vocab_size=64, context=16, n_expert=4, topk=2)
DENSE = MOE.dense()
OPTIM = OptimSpec(lr=1e-3, batch_size=4)


def batch(i: int) -> torch.Tensor:
    return torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(i))


def capture_grads(engine) -> list[dict[str, torch.Tensor]]:
    """The gradients the optimiser sees at each step (read as it steps, before DeepSpeed clears them)."""
    seen: list[dict[str, torch.Tensor]] = []
    step = engine.optimizer.step

    def observed(*args, **kwargs):
        seen.append({n: p.grad.clone() for n, p in engine.module.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    engine.optimizer.step = observed
    return seen


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-7) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_micro_batches_take_the_steps_of_one_batch(dist_group: None, cfg: ModelConfig) -> None:
    # aux_coef 0: the cross-entropy of the whole batch is the mean of its equal micro-batches' exactly
    whole = build_engine(build_model(cfg, seed=0), OPTIM)
    micro = build_engine(build_model(cfg, seed=0), OPTIM, micro_batch_size=1)
    assert micro.gradient_accumulation_steps() == 4
    grads_whole, grads_micro = capture_grads(whole), capture_grads(micro)
    for i in range(2):
        a = train_step(whole, batch(i), 1e-3, 0.0, "cpu")
        b = train_step(micro, batch(i), 1e-3, 0.0, "cpu")
        assert b.loss == pytest.approx(a.loss, rel=1e-6)
        if cfg.is_moe:
            assert b.aux_loss > 0
    assert len(grads_whole) == len(grads_micro) == 2  # one optimiser step per batch, not per micro-batch
    assert whole.global_steps == micro.global_steps == 2
    for g_whole, g_micro in zip(grads_whole, grads_micro, strict=True):
        assert_close(g_whole, g_micro)
    # AdamW's first steps move every weight by ~lr whatever its gradient's size: 1e-6 is 1/1000 of two steps
    assert_close(whole.module.state_dict(), micro.module.state_dict(), atol=1e-6)


def test_aux_loss_is_the_mean_of_the_micro_batches(dist_group: None) -> None:
    coef = 1.0  # large, so a wrong weighting of the aux term would show in the router's gradient
    model = build_model(MOE, seed=0)
    reference = copy.deepcopy(model)
    engine = build_engine(model, OPTIM.model_copy(update={"grad_clip": 0.0}), micro_batch_size=2)  # unclipped
    grads = capture_grads(engine)
    stats = train_step(engine, batch(0), 1e-3, coef, "cpu")
    ces, auxes = zip(*(lm_loss(reference, part, "cpu") for part in batch(0).split(2)), strict=True)
    ce, aux = torch.stack(ces).mean(), torch.stack(auxes).mean()
    (ce + coef * aux).backward()
    assert stats.loss == pytest.approx(ce.item(), rel=1e-6)
    assert stats.aux_loss == pytest.approx(aux.item(), rel=1e-6)
    assert_close(grads[0], {n: p.grad for n, p in reference.named_parameters() if p.grad is not None})


def test_micro_batch_must_divide_a_workers_rows(dist_group: None) -> None:
    with pytest.raises(WorkerError, match=r"micro_batch_size=3 does not divide the 4 sequences.*use a divisor of 4"):
        build_engine(build_model(DENSE, seed=0), OPTIM, micro_batch_size=3)


def saved_bytes(model: UpscaleLM, tokens: torch.Tensor) -> tuple[int, dict[str, torch.Tensor]]:
    """(bytes autograd kept for the backward pass, the gradients) of one forward + backward of CE + aux."""
    kept = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal kept
        kept += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ce, aux = lm_loss(model, tokens, "cpu")
    (ce + aux).backward()
    return kept, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_activation_checkpointing_gives_the_same_gradients(cfg: ModelConfig) -> None:
    cfg = cfg.model_copy(update={"n_layer": 3})
    plain, recomputed = build_model(cfg, seed=0), build_model(cfg, seed=0)
    recomputed.activation_checkpointing = True
    kept_plain, grads_plain = saved_bytes(plain, batch(0))
    kept_recomputed, grads_recomputed = saved_bytes(recomputed, batch(0))
    assert_close(grads_plain, grads_recomputed)
    assert kept_recomputed < kept_plain / 2  # only the blocks' inputs were kept
    with torch.no_grad():  # evaluation keeps nothing either way: no recomputation wrapper
        torch.testing.assert_close(recomputed(batch(1)[:, :-1])[0], plain(batch(1)[:, :-1])[0])


@pytest.mark.slow  # ~5 s: two segments, each tokenising the built-in corpus into its own cache
def test_a_segment_in_micro_batches_takes_the_same_steps_and_lrs(tmp_path) -> None:
    from upscale.sweeps.segments import DataSpec, ModelSpec, ScheduleSpec, SegmentRuntime, SegmentSpec
    from upscale.workers.segment import run_segment

    tps = 8 * 32
    spec = SegmentSpec(kind="dense_decay", model=ModelSpec(n_layer=2, d_model=32, n_head=2, vocab_size=256,
                                                           context=32),
                       data=DataSpec(eval_tokens=2048), optim=OptimSpec(lr=3e-3, batch_size=8),
                       schedule=ScheduleSpec(warmup_tokens=2 * tps), end_tokens=6 * tps, decay_start_tokens=4 * tps)
    runs = []
    for name, options in (("whole", {}), ("micro", {"micro_batch_size": 2, "activation_checkpointing": True})):
        steps: list[tuple[int, float, float]] = []
        rt = SegmentRuntime(checkpoint_dir=str(tmp_path / name), data_cache_dir=str(tmp_path / "cache"), **options)
        result = run_segment(spec, rt, on_step=lambda s, steps=steps: steps.append((s.step, s.lr, s.loss)))
        runs.append((steps, result.val_loss))
    (whole, loss_whole), (micro, loss_micro) = runs
    assert [(s, lr) for s, lr, _ in micro] == [(s, lr) for s, lr, _ in whole] and len(whole) == 6
    assert [x for *_, x in micro] == pytest.approx([x for *_, x in whole], rel=1e-5)
    assert loss_micro == pytest.approx(loss_whole, rel=1e-5)
