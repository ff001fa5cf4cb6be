"""Training throughput: the worker (`run_segment`: DeepSpeed engine, schedule, logging) against a plain PyTorch loop.

The baseline is the minimal loop one would write by hand for the same model: `build_model`, `torch.optim.AdamW` with
the same hyper-parameters, the same batches (`TokenData.batch`), cross-entropy + aux loss, `clip_grad_norm_`, and
nothing else (no DeepSpeed, no logging, no checkpoints). Both run in the same process, interleaved `--repeats` times,
on the same corpus and shapes; each figure is the median tokens/s. The worker is timed through `run_segment`'s
per-step hook, so batch drawing, LR, logging and the NaN check are inside; the first and the
last step (allocation; the final checkpoint save) are left out of both. On CPU the clock is process CPU time by
default, which the other jobs on a shared 2-core machine do not distort (`--wall` for wall-clock). Target:
>= 0.85x.

CPU (default): the `tiny` shape (4 layers, d=128) dense and as an 8x2 MoE, fp32.
`--gpu`: bf16 autocast on CUDA, the paper's 0.1B dense and its 8x2 MoE, and model FLOP utilisation
MFU = FLOPs/token · tokens/s / peak, FLOPs/token = `sweeps.sizes.train_flops_per_token` (6·(N_active + LM head)
+ 12·L·d·T attention; N_active non-embedding, router included) and the card's bf16 dense peak (`--peak-tflops`,
default from the device name). Target for dense: >= 35%.

    .venv/bin/python bench/train_throughput.py            # CPU
    .venv/bin/python bench/train_throughput.py --gpu      # one CUDA device
    .venv/bin/python bench/train_throughput.py --json throughput.json   # the figures as JSON too
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from upscale.sweeps import sizes
from upscale.sweeps.segments import DataSpec, ModelSpec, OptimSpec, ScheduleSpec, SegmentRuntime, SegmentSpec
from upscale.workers.data import TokenData, load_tokens
from upscale.workers.engine import autocast
from upscale.workers.model import ModelConfig, build_model
from upscale.workers.schedule import lr_multiplier
from upscale.workers.segment import run_segment

Clock = Callable[[], float]
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}


def plain_loop(spec: SegmentSpec, data: TokenData, device: str, clock: Clock) -> list[float]:
    """`clock()` after every step of a hand-written loop over the same steps as `spec` (no DeepSpeed)."""
    cfg = ModelConfig.from_spec(spec.model)
    model = build_model(cfg, spec.seed).to(device)
    o = spec.optim
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay,
                             "weight_decay": 0.0}], lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)
    tps, tokens, stamps = spec.tokens_per_step, spec.start_tokens, []
    while tokens < spec.end_tokens:
        batch = data.batch(spec.data.data_seed, tokens // tps, o.batch_size, spec.model.context).to(device)
        for g in opt.param_groups:
            g["lr"] = o.lr * lr_multiplier(tokens + tps, spec.schedule, spec.decay_start_tokens, spec.end_tokens)
        with autocast(device):
            logits, aux = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        (loss + cfg.aux_loss_coef * aux.float()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # the worker reads the loss every step (NaN check, logging); so does the baseline
        tokens += tps
        stamps.append(clock())
    return stamps


def worker(spec: SegmentSpec, runtime: SegmentRuntime, clock: Clock) -> list[float]:
    """`clock()` after every step of `run_segment` (its step hook)."""
    stamps: list[float] = []
    run_segment(spec, runtime, on_step=lambda _: stamps.append(clock()))
    return stamps


def rate(stamps: list[float], tokens_per_step: int) -> float:
    """tokens/s over steps 2..N-1: the first step (allocation) and the last (the worker saves its final
    checkpoint inside it) are left out of both."""
    return (len(stamps) - 2) * tokens_per_step / (stamps[-2] - stamps[0])


def model_flops_per_token(spec: ModelSpec) -> float:
    """`sweeps.sizes.train_flops_per_token`: 6·(N_active + LM head) + 12·L·d·T attention."""
    shape = spec.shape
    n = sizes.moe_active_params(shape, spec.n_expert, spec.topk) if spec.n_expert else sizes.dense_params(shape)
    return sizes.train_flops_per_token(shape, n, spec.context, spec.vocab_size)


def segment(model: ModelSpec, steps: int, batch_size: int, lr: float) -> SegmentSpec:
    tps = batch_size * model.context
    return SegmentSpec(kind="dense_trunk" if not model.n_expert else "scratch_trunk", model=model,
                       data=DataSpec(eval_tokens=model.context * batch_size),
                       optim=OptimSpec(lr=lr, batch_size=batch_size),
                       schedule=ScheduleSpec(warmup_tokens=2 * tps), end_tokens=steps * tps)


def measure(name: str, spec: SegmentSpec, device: str, repeats: int, work: Path, threads: int,
            clock: Clock) -> dict:
    data = load_tokens(spec.data, spec.model.context, work / "cache")
    ours, base = [], []
    for r in range(repeats):  # interleaved, order alternating, so load from other processes hits both alike
        rt = SegmentRuntime(checkpoint_dir=str(work / f"{name}-{r}"), data_cache_dir=str(work / "cache"),
                            device=device, num_threads=threads, log_every_steps=10)
        for which in (("plain", "ours") if r % 2 == 0 else ("ours", "plain")):
            if which == "plain":
                base.append(rate(plain_loop(spec, data, device, clock), spec.tokens_per_step))
            else:
                ours.append(rate(worker(spec, rt, clock), spec.tokens_per_step))
    row = {"name": name, "ours": statistics.median(ours), "plain": statistics.median(base)}
    row["ratio"] = row["ours"] / row["plain"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true", help="bf16 on CUDA, 0.1B dense and 8x2 MoE, with MFU")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="optimiser steps per measurement")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the 2-core machine is shared)")
    ap.add_argument("--wall", action="store_true", help="CPU: wall-clock instead of process CPU time")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the card's bf16 dense peak (GPU mode)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.gpu:
        if not torch.cuda.is_available():
            raise SystemExit("--gpu: no CUDA device visible")
        device = "cuda"
        s = sizes.shape_of("0.1B")
        dense = ModelSpec(n_layer=s.n_layer, d_model=s.d_model, n_head=s.n_head, vocab_size=256, context=1024,
                          init_std=0.025)
        steps, batch_size, lr = args.steps or 30, 32, 1e-3
        name = torch.cuda.get_device_name()
        peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
        if peak is None:
            raise SystemExit(f"unknown peak for {name!r}; pass --peak-tflops")
    else:
        device, name, peak = "cpu", f"CPU, {args.threads} threads, fp32", None
        s = sizes.shape_of("tiny")
        dense = ModelSpec(n_layer=s.n_layer, d_model=s.d_model, n_head=s.n_head, vocab_size=256, context=128)
        steps, batch_size, lr = args.steps or 24, 8, 3e-3
    moe = dense.model_copy(update={"n_expert": 8, "topk": 2})
    # On a shared CPU, process CPU time is what contention does not distort (one thread: CPU time ~ busy time);
    # on a GPU every step ends in a .item() sync, so wall-clock is the honest clock.
    clock = time.perf_counter if args.gpu or args.wall else time.process_time
    print(f"device: {name}; {steps} steps x {batch_size} x {dense.context} tokens, median of {args.repeats}, "
          f"clock: {clock.__name__}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, model in (("dense", dense), ("moe 8x2", moe)):
            row = measure(label.replace(" ", ""), segment(model, steps, batch_size, lr), device, args.repeats,
                          Path(tmp), args.threads, clock)
            line = (f"{label:8s} worker {row['ours']:10,.0f} tok/s   plain loop {row['plain']:10,.0f} tok/s   "
                    f"ratio {row['ratio']:.3f}x")
            if peak:
                flops = model_flops_per_token(model)
                row |= {"flops_per_token": flops, "mfu_worker": flops * row["ours"] / (peak * 1e12),
                        "mfu_plain": flops * row["plain"] / (peak * 1e12)}
                line += f"   MFU worker {row['mfu_worker']:.1%}  plain {row['mfu_plain']:.1%}"
            rows.append(row)
            print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "peak_tflops": peak, "steps": steps, "batch_size": batch_size,
                       "context": dense.context, "repeats": args.repeats, "clock": clock.__name__, "rows": rows},
                      f, indent=2)


if __name__ == "__main__":
    main()
