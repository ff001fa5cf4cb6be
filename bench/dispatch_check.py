"""Correctness of the grouped MoE dispatch against references: an fp64 loop of experts, and DeepSpeed's dispatch.

1. `workers.dispatch.experts_grouped_mm` (the `torch._grouped_mm` path the worker takes on CUDA in bf16) against
   `experts_loop` run in fp64 on the same weights and rows, forward and backward (the rows' gradient and each
   weight's), with some experts given no rows at all (a zero-size group must give zero gradients, not garbage).
2. A whole 8x2 MoE with `dispatch="grouped"` against the same model (same seed, same weights) with
   `dispatch="deepspeed"`: logits, the aux loss, and the gradients of every parameter after one backward.

Each figure is a relative error, max|x - ref| / max|ref|; `ok` says whether all are under their tolerance (bf16:
2e-2 for one expert layer against fp64, 3e-2 for a whole model; fp32: 1e-5). On CUDA the grouped path runs in bf16
as training does; on CPU (the device check's dry run) `_grouped_mm` is called in bf16 too where torch has it.

    .venv/bin/python bench/dispatch_check.py --json dispatch.json                 # CPU, tiny
    python3 bench/dispatch_check.py --device cuda --size 0.1B --json dispatch.json  # a GPU
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from upscale.workers.dispatch import experts_grouped_mm, experts_loop
from upscale.workers.engine import autocast
from upscale.workers.model import ModelConfig, SwiGLU, build_model

TOLERANCE = {"bf16_layer": 2e-2, "bf16_model": 3e-2, "fp32": 1e-5}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max|x - ref| / max|ref| in fp64 (0 when both are zero)."""
    x, ref = x.double(), ref.double()
    scale = ref.abs().max().item()
    return (x - ref).abs().max().item() / scale if scale else (x - ref).abs().max().item()


def expert_layer(d_model: int, d_ff: int, counts: list[int], device: str) -> dict:
    """The grouped path (bf16) and the fp32 loop, each against an fp64 loop: forward output and gradients."""
    gen = torch.Generator().manual_seed(0)
    experts = [SwiGLU(d_model, d_ff) for _ in counts]
    for e in experts:
        for p in e.parameters():
            p.data = torch.randn(p.shape, generator=gen) * d_model**-0.5
    rows = torch.randn(sum(counts), d_model, generator=gen)
    upstream = torch.randn(sum(counts), d_model, generator=gen)

    def run(dtype: torch.dtype, grouped: bool) -> list[torch.Tensor]:
        copies = [SwiGLU(d_model, d_ff).to(device, dtype) for _ in experts]
        for c, e in zip(copies, experts, strict=True):
            c.load_state_dict(e.state_dict())
        x = rows.to(device, dtype, copy=True).requires_grad_()
        out = (experts_grouped_mm(copies, x, counts, torch.bfloat16) if grouped
               else experts_loop(copies, x, counts))
        out.backward(upstream.to(device, out.dtype))
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for c in copies for p in c.parameters()]
        return [out.detach(), x.grad, *grads]

    ref = run(torch.float64, grouped=False)
    fp32 = run(torch.float32, grouped=False)
    row = {"d_model": d_model, "d_ff": d_ff, "counts": counts, "empty_experts": sum(c == 0 for c in counts),
           "loop_fp32": {"forward": rel_err(fp32[0], ref[0]), "grad_rows": rel_err(fp32[1], ref[1]),
                         "grad_weights": max(rel_err(a, b) for a, b in zip(fp32[2:], ref[2:], strict=True))}}
    if hasattr(torch, "_grouped_mm"):
        got = run(torch.float32, grouped=True)
        empty = [i for i, c in enumerate(counts) if c == 0]
        row["grouped_bf16"] = {
            "forward": rel_err(got[0], ref[0]), "grad_rows": rel_err(got[1], ref[1]),
            "grad_weights": max(rel_err(a, b) for a, b in zip(got[2:], ref[2:], strict=True)),
            # each expert has 3 weights: an expert given no rows must get exactly zero gradients
            "empty_expert_grads_zero": all(bool((g == 0).all()) for i in empty for g in got[2 + 3 * i: 5 + 3 * i]),
        }
    return row


def whole_model(size: str, batch: int, context: int, device: str) -> dict:
    """An 8x2 MoE, grouped against DeepSpeed's dispatch: logits, aux loss and all gradients after one backward."""
    cfg = ModelConfig.from_size(size, vocab_size=256, context=context, n_expert=8, topk=2)
    tokens = torch.randint(0, 256, (batch, context + 1), generator=torch.Generator().manual_seed(1)).to(device)
    out = {}
    for dispatch in ("deepspeed", "grouped"):
        model = build_model(cfg.updated(dispatch=dispatch), seed=0).to(device).train()
        with autocast(device):
            logits, aux = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 256), tokens[:, 1:].reshape(-1))
        (loss + cfg.aux_loss_coef * aux.float()).backward()
        out[dispatch] = (logits.detach(), aux.detach(), {n: p.grad for n, p in model.named_parameters()})
        del model
    (ds_logits, ds_aux, ds_grads), (g_logits, g_aux, g_grads) = out["deepspeed"], out["grouped"]
    missing = sorted(n for n in ds_grads if (ds_grads[n] is None) != (g_grads[n] is None))
    return {"size": size, "batch": batch, "context": context,
            "logits": rel_err(g_logits, ds_logits), "aux_loss": rel_err(g_aux, ds_aux),
            "grads": max(rel_err(g_grads[n], ds_grads[n]) for n in ds_grads if ds_grads[n] is not None),
            "params_with_grad_in_one_only": missing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--size", default="nano", help="the whole-model check's shape (sweeps/sizes.py)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device visible; run on a GPU machine or use --device cpu")
    cuda = args.device.startswith("cuda")
    cfg = ModelConfig.from_size(args.size)
    # 8 experts, 3 of them empty; on a GPU at the size's own width, on a CPU at a small one
    d_model, d_ff = (cfg.d_model, cfg.d_ff) if cuda else (32, 64)
    scale = 64 if cuda else 4
    counts = [c * scale for c in (5, 0, 17, 0, 3, 9, 0, 30)]
    layer = expert_layer(d_model, d_ff, counts, args.device)
    model = whole_model(args.size, args.batch, args.context, args.device)
    model_tol = TOLERANCE["bf16_model"] if cuda else TOLERANCE["fp32"]
    checks = [layer["loop_fp32"][k] < TOLERANCE["fp32"] * 10 for k in ("forward", "grad_rows", "grad_weights")]
    if "grouped_bf16" in layer:
        g = layer["grouped_bf16"]
        checks += [g[k] < TOLERANCE["bf16_layer"] for k in ("forward", "grad_rows", "grad_weights")]
        checks.append(g["empty_expert_grads_zero"])
    checks += [model[k] < model_tol for k in ("logits", "aux_loss", "grads")]
    checks.append(not model["params_with_grad_in_one_only"])
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "expert_layer": layer,
              "model_vs_deepspeed": model, "tolerance": {**TOLERANCE, "model": model_tol}, "ok": all(checks)}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if not result["ok"]:
        raise SystemExit("error: the grouped dispatch differs from its reference beyond tolerance (figures above)")


if __name__ == "__main__":
    main()
