"""Granular ("virtual group") upcycling, Megatron-LM `upcycling_utils.py` / He et al. 2024 (docs/methods.md).

G = d_ff / expert_d_ff (granularity), N experts, R = N / G virtual groups. Expert e holds shard (e mod G) of the
dense FFN: contiguous neuron block [s·f_e, (s+1)·f_e) of W_gate/W_up rows and W_down columns. The router keeps
the first R rows of a fresh N-row router and repeats each G times (expert e uses row floor(e/G)), so the G experts
of a group get bit-identical logits and a top-k with k % G == 0 always selects whole groups.

Scaling: with DeepSpeed's renormalised top-k a selected group's G members share weight w/G, so its output is
(w/G)·FFN; the whole factor a = G is put on W_down only, which is exact for SwiGLU (silu(s·z) != s·silu(z) makes
Megatron's a^(1/3) on all three matrices only approximate: ~7% error, shown by
tests/workers/upcycling/test_granular.py). With these two choices the upcycled MoE computes the dense function exactly
for every k that is a multiple of G.
"""

from __future__ import annotations

import torch

from upscale.sweeps.segments import UpcycleSpec
from upscale.sweeps.sizes import expert_widths
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig
from upscale.workers.upcycling.adapter import FFN, LayerMoE, assemble, dense_ffn, fresh_router


def configure(cfg: ModelConfig, spec: UpcycleSpec) -> ModelConfig:
    """Experts of width d_ff / G; G must divide d_ff and n_expert, and topk must select whole groups."""
    try:
        expert_d_ff, shared_d_ff = expert_widths(spec, cfg.d_ff, cfg.n_expert, cfg.topk)
    except ValueError as e:
        raise WorkerError(str(e)) from None
    if cfg.router_type != "linear":
        raise WorkerError(f"granular upcycling replicates rows of a linear router; got router_type={cfg.router_type}")
    return cfg.updated(expert_d_ff=expert_d_ff, shared_d_ff=shared_d_ff)


def shard_experts(ffn: FFN, n_expert: int, granularity: int) -> list[FFN]:
    """Expert e = shard (e mod G), W_down scaled by G."""
    g, u, d = ffn
    fe = g.shape[0] // granularity
    out = []
    for e in range(n_expert):
        s = slice((e % granularity) * fe, (e % granularity + 1) * fe)
        out.append((g[s].clone(), u[s].clone(), d[:, s] * granularity))
    return out


def replicate_router(weight: torch.Tensor, granularity: int) -> torch.Tensor:
    """Keep the first N/G rows, repeat each G times: row e == row floor(e/G) of the kept block."""
    n = weight.shape[0]
    return weight[: n // granularity].repeat_interleave(granularity, dim=0).clone()


def build(
    dense_sd: dict[str, torch.Tensor],
    cfg: ModelConfig,
    spec: UpcycleSpec,
    calibration_tokens: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    g = cfg.d_ff // cfg.d_expert
    if g * cfg.d_expert != cfg.d_ff or g != spec.granularity:
        raise WorkerError(
            f"config expert_d_ff={cfg.d_expert} does not match granularity={spec.granularity} of d_ff={cfg.d_ff}"
        )
    layers = []
    for l in range(cfg.n_layer):
        router = fresh_router(cfg, spec.seed, l)
        layers.append(
            LayerMoE(
                shard_experts(dense_ffn(dense_sd, l), cfg.n_expert, g),
                {"weight": replicate_router(router["weight"], g)},
            )
        )
    return assemble(dense_sd, cfg, layers)
