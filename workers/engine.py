"""The DeepSpeed engine every training segment runs on, and one optimiser step through it.

AdamW per `OptimSpec` with two parameter groups (matrices decayed, norm weights not), split by DeepSpeed's
`split_params_into_different_moe_groups_for_optimizer` so expert parameters sit in their own groups (required by ZeRO
1/2 with MoE; docs/methods.md, "DeepSpeed-MoE facts the code relies on"). The engine holds fp32 weights everywhere; on
CUDA the forward runs under bf16 autocast (the `SegmentRuntime.device` contract), on CPU in plain fp32 over gloo. The LR
is set on the optimiser's groups before every step from the pure schedule function, so no DeepSpeed LR scheduler state
exists to save or to drift. The loss is cross-entropy plus `aux_loss_coef` times the summed DeepSpeed load-balancing
loss; under loss-free balancing it is cross-entropy alone, and after the optimiser step each MoE layer's routing bias
moves toward equal load, from the step's expert counts summed over micro-batches and all ranks (under expert parallelism
every rank's gate routes its own tokens over all experts). On several processes (workers/parallel.py) each rank steps on
its rows of the global batch and DeepSpeed averages the gradients (expert gradients over the expert-data-parallel group,
scaled by the whole data-parallel size). A rank's rows may pass in micro-batches (docs/training.md): DeepSpeed
accumulates their gradients (each micro-batch's loss scaled by 1/N) and steps once at the accumulation boundary, so an
optimiser step, the LR and the schedule's step count stay per batch; the cross-entropy's gradient is the whole batch's,
the load-balancing loss is each micro-batch's own, averaged (as it is each rank's own).
"""

from __future__ import annotations

import contextlib
import gc
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from upscale.sweeps.segments import OptimSpec
from upscale.workers.distributed import init_single_process
from upscale.workers.errors import WorkerError
from upscale.workers.model import UpscaleLM
from upscale.workers.parallel import SINGLE, Ranks


def param_groups(model: UpscaleLM, weight_decay: float) -> list[dict]:
    """Decayed matrices and undecayed vectors (norm weights), then expert params split into their own groups."""
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"name": "decay", "params": decay, "weight_decay": weight_decay},
              {"name": "no_decay", "params": no_decay, "weight_decay": 0.0}]
    return split_params_into_different_moe_groups_for_optimizer(groups)


def build_engine(model: UpscaleLM, optim: OptimSpec, zero_stage: int = 0, device: str = "cpu",
                 ranks: Ranks = SINGLE, micro_batch_size: int | None = None):
    """A DeepSpeed engine around `model` with AdamW over the process group of `ranks` (created here for a single
    process); each rank steps on `batch_size / world` rows of the global batch, `micro_batch_size` rows per forward
    pass (default: all of them). Returns the engine."""
    import deepspeed

    if zero_stage not in (0, 1, 2):
        raise WorkerError(f"zero_stage={zero_stage}: DeepSpeed-MoE supports ZeRO stages 0, 1 and 2 (not 3)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise WorkerError(f"device={device!r} asked for but CUDA is not available; use device='cpu'")
    if optim.batch_size % ranks.world:
        raise WorkerError(f"batch_size={optim.batch_size} is not divisible by workers={ranks.world}: each worker "
                          f"takes an equal share of the batch")
    rows = optim.batch_size // ranks.world
    micro = micro_batch_size or rows
    if rows % micro:
        raise WorkerError(f"micro_batch_size={micro} does not divide the {rows} sequences each of {ranks.world} "
                          f"worker(s) takes per step (batch_size={optim.batch_size}); use a divisor of {rows}")
    if ranks.world == 1:
        init_single_process("nccl" if device.startswith("cuda") else "gloo")
    model.to(device)
    opt = torch.optim.AdamW(param_groups(model, optim.weight_decay), lr=optim.lr or 0.0,
                            betas=(optim.beta1, optim.beta2), eps=optim.eps)
    config = {
        "train_batch_size": optim.batch_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": rows // micro,
        "gradient_clipping": optim.grad_clip,
        "zero_optimization": {"stage": zero_stage},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return engine


def release_device_memory(device: str) -> None:
    """On CUDA, hand a finished segment's GPU memory back once its engine and model are unreferenced: collect their
    reference cycles (DeepSpeed's hooks make some), then empty torch's caching allocator, which otherwise keeps the
    freed blocks for this process and leaves the next segment (an LR-search trial, a CLI run) less of the GPU. On a
    CPU nothing is done: Python's own collector frees the host memory in its time, and a full collection in a
    process holding torch and DeepSpeed costs seconds per segment (the worker tests ran 3.7x longer with it)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class StepStats:
    """One optimiser step: the LM loss, the raw (uncoefficiented) aux loss, the pre-clip gradient norm (None where
    DeepSpeed does not report it: ZeRO stage 0 clips without returning the norm)."""

    loss: float
    aux_loss: float
    grad_norm: float | None


def autocast(device: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA; nothing on CPU (fp32)."""
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lm_loss(model: torch.nn.Module, tokens: torch.Tensor, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(cross-entropy of next-token prediction, summed aux loss) for a [B, T+1] token batch."""
    tokens = tokens.to(device, non_blocking=True)
    with autocast(device):
        logits, aux = model(tokens[:, :-1])
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    return ce, aux.float()


def set_lr(engine, lr: float) -> None:
    for group in engine.optimizer.param_groups:
        group["lr"] = lr


class NonFiniteLoss(WorkerError):
    """The loss became NaN or infinite; raised before the step, so the weights are still the last good ones."""


def train_step(engine, tokens: torch.Tensor, lr: float, aux_coef: float, device: str,
               ranks: Ranks = SINGLE) -> StepStats:
    """Forward, backward and AdamW step at `lr` on this rank's rows of `tokens`, in the engine's micro-batches (one
    optimiser step at the last); the reported losses are means over micro-batches and ranks, and a non-finite loss on
    any rank raises on every rank before anything is updated."""
    set_lr(engine, lr)
    micros = ranks.rows(tokens).split(engine.train_micro_batch_size_per_gpu())
    total = torch.zeros(2, device=device)
    loads = 0
    for i, micro in enumerate(micros):
        ce, aux = lm_loss(engine, micro, device)
        total += torch.stack([ce.detach(), aux.detach()])
        if engine.module.cfg.balancing == "loss_free":
            loads = loads + torch.stack(engine.module.expert_counts)
        if i == len(micros) - 1:  # one device sync per step, before the backward pass that steps
            loss, aux_loss = (ranks.mean(total) / len(micros)).tolist()
            if not math.isfinite(loss + aux_coef * aux_loss):
                raise NonFiniteLoss(f"loss is {loss} (aux {aux_loss})")
        engine.backward(ce + aux_coef * aux)  # DeepSpeed scales by 1 / len(micros) and counts the boundary
        engine.step()  # steps the optimiser at the boundary only
    if engine.module.cfg.balancing == "loss_free":
        engine.module.balance_experts(ranks.sum(loads))  # every rank the same loads, so the same biases
    norm = engine.get_global_grad_norm()
    return StepStats(loss=loss, aux_loss=aux_loss, grad_norm=float(norm) if norm is not None else None)
