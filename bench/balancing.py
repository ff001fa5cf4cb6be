"""Loss-free against aux-loss balancing on a tiny MoE: load imbalance and loss after the same training.

Both arms are the same model from the same init (the `micro` shape, 2 layers, d=64, as an 8-expert top-2 MoE, byte
tokens of the built-in Python-stdlib corpus), trained on the same batches through the worker's engine and
`train_step` at a constant LR after a short warmup: `aux_loss` adds `--aux-coef` times DeepSpeed's load-balancing
loss (the paper's 1e-3 by default), `loss_free` adds none and moves each layer's routing bias by `--rate` toward
equal load after every step (docs/methods.md, "Loss-free balancing"). Reported per arm: the load imbalance
(max/mean expert load, averaged over layers, from the token counts of the last `--window` steps), the mean train
loss over those steps, and the validation loss at the end; then loss_free / aux_loss for each, averaged over
`--seeds` inits.

    .venv/bin/python bench/balancing.py                    # 300 steps, 2 seeds
    .venv/bin/python bench/balancing.py --steps 600 --json balancing.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from upscale.sweeps.segments import DataSpec, OptimSpec
from upscale.workers.data import load_tokens
from upscale.workers.engine import build_engine, train_step
from upscale.workers.evaluate import val_loss
from upscale.workers.model import ModelConfig, build_model

ARMS = ("aux_loss", "loss_free")


def run(cfg: ModelConfig, data, seed: int, steps: int, window: int, batch: int, lr: float, aux_coef: float) -> dict:
    engine = build_engine(build_model(cfg, seed=seed), OptimSpec(lr=lr, batch_size=batch))
    warmup = max(1, steps // 20)
    loads = torch.zeros(cfg.n_layer, cfg.n_expert)
    losses = []
    for step in range(steps):
        tokens = data.batch(seed, step, batch, cfg.context)
        stats = train_step(engine, tokens, lr * min(1.0, (step + 1) / warmup), aux_coef, "cpu")
        if step >= steps - window:
            loads += torch.stack(engine.module.expert_counts).float()
            losses.append(stats.loss)
    imbalance = float((loads.max(1).values / loads.mean(1)).mean())
    val = val_loss(engine.module, data.val_batches(cfg.context * 64, cfg.context, batch), "cpu")
    return {"imbalance": imbalance, "train_loss": statistics.fmean(losses), "val_loss": val}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--window", type=int, default=50, help="last steps whose loads and losses are reported")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--aux-coef", type=float, default=1e-3)
    ap.add_argument("--rate", type=float, default=1e-3, help="loss_free's bias update per step")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from upscale.workers.distributed import init_single_process

    init_single_process()
    base = ModelConfig.from_size("micro", vocab_size=256, context=args.context, n_expert=8, topk=2)
    with tempfile.TemporaryDirectory() as work:
        data = load_tokens(DataSpec(eval_tokens=args.context * 64), args.context, Path(work) / "cache")
        rows = {arm: [run(base.updated(balancing=arm, balancing_rate=args.rate), data, seed, args.steps, args.window,
                          args.batch, args.lr, args.aux_coef if arm == "aux_loss" else 0.0)
                      for seed in range(args.seeds)] for arm in ARMS}
    means = {arm: {k: statistics.fmean(r[k] for r in rows[arm]) for k in rows[arm][0]} for arm in ARMS}
    ratio = {k: means["loss_free"][k] / means["aux_loss"][k] for k in means["aux_loss"]}
    print(f"micro 8x2 MoE, {args.steps} steps x {args.batch}x{args.context} tokens, {args.seeds} seeds; "
          f"aux_coef={args.aux_coef}, rate={args.rate}; last {args.window} steps")
    print(f"{'arm':<10} {'imbalance':>10} {'train_loss':>11} {'val_loss':>9}")
    for arm in ARMS:
        m = means[arm]
        print(f"{arm:<10} {m['imbalance']:>10.3f} {m['train_loss']:>11.4f} {m['val_loss']:>9.4f}")
    print(f"{'ratio':<10} {ratio['imbalance']:>10.3f} {ratio['train_loss']:>11.4f} {ratio['val_loss']:>9.4f}"
          "   (loss_free / aux_loss)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": rows,
                                         "means": means, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
