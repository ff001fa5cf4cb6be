"""MoE dispatch speed: the grouped dropless dispatch against DeepSpeed's, both against the dense model, per active FLOP.

For each shape (default: the `tiny` and `micro` sizes of sweeps/sizes.py) one run trains, interleaved `--repeats`
times with the order rotating (so load from other processes hits every model alike): the dense model, the same trunk
as an 8x2 MoE with DeepSpeed's dispatch (`dispatch="deepspeed"`) and with the grouped one (`dispatch="grouped"`).
Each measurement is `--steps` AdamW training steps (forward, cross-entropy + aux loss, backward, step) on random
tokens; the first step (allocation) is left out; each figure is the median tokens/s over the repeats.

active_flops_ratio = (MoE tokens/s x its training FLOPs per token) / (dense tokens/s x the dense FLOPs per token),
FLOPs per token from `UpscaleLM.flops_per_token()` (the planner's count: 6·(N_active + LM head) + attention), so
1.0 means the MoE does its active work as fast as the dense model does its own. max_abs_diff: the largest
|logit| difference between the two MoE dispatches (same weights, same batch, fp32 on CPU).

On CPU the clock is process CPU time (what other jobs on a shared machine do not distort; `--wall` for
wall-clock). `--device cuda --dtype bf16` runs the same under bf16 autocast on a GPU and adds MFU against the card's
bf16 dense peak (`--peak-tflops`, default from the device name); there `--sizes 0.1B` is the paper's size.

    .venv/bin/python bench/moe_dispatch.py --json moe_dispatch.json
    .venv/bin/python bench/moe_dispatch.py --device cuda --dtype bf16 --sizes 0.1B --batch 32 --context 1024
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from upscale.workers.engine import autocast
from upscale.workers.model import ModelConfig, UpscaleLM, build_model

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}
MODELS = ("dense", "deepspeed", "grouped")


def train_rate(model: UpscaleLM, batches: list[torch.Tensor], device: str, clock: Callable[[], float]) -> float:
    """Tokens/s of AdamW training steps over `batches` (the first step, allocation, not timed)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    stamps = []
    for batch in batches:
        with autocast(device):
            logits, aux = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        (loss + model.cfg.aux_loss_coef * aux.float()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # a sync per step, as the worker reads the loss every step
        stamps.append(clock())
    tokens = batches[0][:, :-1].numel()
    return (len(stamps) - 1) * tokens / (stamps[-1] - stamps[0])


@torch.no_grad()
def dispatch_diff(cfg: ModelConfig, batch: torch.Tensor, device: str) -> float:
    """max |logits| difference between the two dispatches of one MoE (same seed: same weights), in fp32."""
    ds, grouped = (build_model(cfg.updated(dispatch=d), seed=0).to(device) for d in ("deepspeed", "grouped"))
    return (ds(batch)[0] - grouped(batch)[0]).abs().max().item()


def measure_shape(size: str, args: argparse.Namespace, clock: Callable[[], float]) -> dict[str, float]:
    dense_cfg = ModelConfig.from_size(size, vocab_size=args.vocab, context=args.context)
    cfgs = {"dense": dense_cfg, **{d: dense_cfg.updated(n_expert=8, topk=2, dispatch=d)
                                   for d in ("deepspeed", "grouped")}}
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, args.vocab, (args.batch, args.context + 1), generator=gen).to(args.device)
               for _ in range(args.steps + 1)]
    rates: dict[str, list[float]] = {name: [] for name in MODELS}
    for r in range(args.repeats):
        for name in MODELS[r % 3:] + MODELS[: r % 3]:
            model = build_model(cfgs[name], seed=0).to(args.device).train()
            rates[name].append(train_rate(model, batches, args.device, clock))
            del model
    tps = {name: statistics.median(v) for name, v in rates.items()}
    flops = {name: build_model(cfg, seed=0, device="meta").flops_per_token() for name, cfg in cfgs.items()}
    dense_work = tps["dense"] * flops["dense"]
    row = {
        "dense_tokens_per_s": tps["dense"],
        "moe_tokens_per_s": tps["grouped"],
        "deepspeed_moe_tokens_per_s": tps["deepspeed"],
        "active_flops_ratio": tps["grouped"] * flops["grouped"] / dense_work,
        "deepspeed_active_flops_ratio": tps["deepspeed"] * flops["deepspeed"] / dense_work,
        "max_abs_diff": dispatch_diff(cfgs["grouped"], batches[0][:, :-1], args.device),
        "dense_flops_per_token": flops["dense"],
        "moe_flops_per_token": flops["grouped"],
    }
    if args.peak:
        for name, key in (("dense", "dense_mfu"), ("grouped", "moe_mfu"), ("deepspeed", "deepspeed_moe_mfu")):
            row[key] = tps[name] * flops[name] / (args.peak * 1e12)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "micro"], help="shapes (sweeps/sizes.py); first = headline")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast, CUDA only")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8, help="timed training steps per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads on CPU (1: a shared machine)")
    ap.add_argument("--wall", action="store_true", help="CPU: wall-clock instead of process CPU time")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the card's bf16 dense peak (CUDA)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    if cuda != (args.dtype == "bf16"):
        raise SystemExit("error: bf16 (autocast) runs on --device cuda; CPU runs fp32")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device visible")
    args.peak = None
    device_name = f"CPU, {args.threads} threads, fp32"
    if cuda:
        device_name = torch.cuda.get_device_name()
        args.peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)
        if args.peak is None:
            raise SystemExit(f"error: unknown bf16 peak for {device_name!r}; pass --peak-tflops")
    # CPU time is what contention on a shared CPU does not distort; a GPU step ends in a sync, so wall-clock there
    clock = time.perf_counter if cuda or args.wall else time.process_time
    print(f"device: {device_name}; {args.steps} steps x {args.batch} x {args.context} tokens, median of "
          f"{args.repeats}, clock: {clock.__name__}")
    shapes = {}
    for size in args.sizes:
        row = shapes[size] = measure_shape(size, args, clock)
        line = (f"{size:6s} dense {row['dense_tokens_per_s']:9,.0f} tok/s   8x2 grouped {row['moe_tokens_per_s']:9,.0f}"
                f"   8x2 deepspeed {row['deepspeed_moe_tokens_per_s']:9,.0f}   per active FLOP vs dense: grouped "
                f"{row['active_flops_ratio']:.2f}x, deepspeed {row['deepspeed_active_flops_ratio']:.2f}x   "
                f"max|diff| {row['max_abs_diff']:.1e}")
        if args.peak:
            line += (f"   MFU dense {row['dense_mfu']:.1%} grouped {row['moe_mfu']:.1%} "
                     f"deepspeed {row['deepspeed_moe_mfu']:.1%}")
        print(line, flush=True)
    out = {**shapes[args.sizes[0]], "headline_size": args.sizes[0], "device": device_name, "shapes": shapes}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
