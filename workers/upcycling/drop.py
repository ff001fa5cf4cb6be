"""Drop-Upcycling (Nakamura et al., ICLR 2025): copy the FFN, then re-initialise a fraction r of its neurons.

Per MoE layer and expert: S = a uniform random subset of the f intermediate neurons with |S| = floor(r·f); the
selected rows of W_gate and W_up and columns of W_down are replaced by i.i.d. N(mu, sigma^2), where mu and sigma
(unbiased) are the mean and std of the selected entries *of that matrix* (fp32). `index_mode="shared"` uses one S
for all three matrices, as the paper prescribes ("shared indices across all three weight matrices");
`"per_matrix"` draws S independently per matrix, as the official conversion script does (docs/methods.md,
"Drop-Upcycling"). The official script's per-expert permutation of neurons is function-neutral and is left out, so
expert neuron j stays dense neuron j and the preserved part can be checked index by index. r = 0 is naive
upcycling; every expert gets its own generator per (seed, layer, expert), so results do not depend on iteration
order.
"""

from __future__ import annotations

import math

import torch

from upscale.sweeps.segments import UpcycleSpec
from upscale.workers.model import ModelConfig, seeded_generator
from upscale.workers.upcycling import naive
from upscale.workers.upcycling.adapter import FFN, LayerMoE, assemble, dense_ffn, fresh_router

_DROP_STREAM = 2  # generator purpose key; routers use 1 (workers.model)


def n_dropped(r: float, f: int) -> int:
    """floor(r·f): the neurons re-initialised per matrix (the official code's int())."""
    return math.floor(r * f)


def _redraw(sel: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    # std of a single element is NaN: a lone entry is redrawn at its own value's mean with zero spread
    mu = sel.mean()
    sigma = sel.std() if sel.numel() > 1 else torch.zeros(())
    return torch.randn(sel.shape, generator=gen) * sigma + mu


def drop_expert(ffn: FFN, r: float, index_mode: str, gen: torch.Generator) -> FFN:
    """One expert: a copy of `ffn` with floor(r·f) neurons per matrix redrawn from that matrix's statistics."""
    g, u, d = (t.clone() for t in ffn)
    f = g.shape[0]
    k = n_dropped(r, f)
    if k == 0:
        return g, u, d
    if index_mode == "shared":
        sets = [torch.randperm(f, generator=gen)[:k]] * 3
    else:
        sets = [torch.randperm(f, generator=gen)[:k] for _ in range(3)]
    for w, axis, s in zip((g, u, d), (0, 0, 1), sets, strict=True):
        if axis == 0:
            w[s] = _redraw(w[s], gen)
        else:
            w[:, s] = _redraw(w[:, s], gen)
    return g, u, d


def configure(cfg: ModelConfig, spec: UpcycleSpec) -> ModelConfig:
    """Experts are edited copies of the FFN: naive's shape rule."""
    return naive.configure(cfg, spec)


def build(
    dense_sd: dict[str, torch.Tensor],
    cfg: ModelConfig,
    spec: UpcycleSpec,
    calibration_tokens: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    layers = []
    for l in range(cfg.n_layer):
        ffn = dense_ffn(dense_sd, l)
        experts = [
            drop_expert(ffn, spec.r, spec.index_mode, seeded_generator(spec.seed, _DROP_STREAM, l, e))
            for e in range(cfg.n_expert)
        ]
        layers.append(LayerMoE(experts, fresh_router(cfg, spec.seed, l)))
    return assemble(dense_sd, cfg, layers)
