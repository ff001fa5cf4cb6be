"""Random-noise upcycling: copies of the dense FFN with noise, in the two recipes that exist (docs/methods.md).

* `replace_elementwise` (OLMoE, `noise_injection` in scripts/sparsify_ckpt_unsharded.py; the default): an
  element-wise Bernoulli(ratio) mask per expert and per matrix; masked entries are *replaced* by N(0, std^2).
* `add_neuronwise` (Drop-Upcycling's noise baseline, conversions/noise_upcycling.py): floor(ratio·f) neurons per
  matrix, drawn independently per matrix, get N(0, std^2) *added* (rows of W_gate/W_up, columns of W_down).

Defaults ratio 0.5, std 0.02 (both recipes). Neither is function-preserving; ratio 0 is naive upcycling.
"""

from __future__ import annotations

import torch

from upscale.sweeps.segments import UpcycleSpec
from upscale.workers.model import ModelConfig, seeded_generator
from upscale.workers.upcycling import naive
from upscale.workers.upcycling.adapter import FFN, LayerMoE, assemble, dense_ffn, fresh_router
from upscale.workers.upcycling.drop import n_dropped

_NOISE_STREAM = 3


def replace_elementwise(ffn: FFN, ratio: float, std: float, gen: torch.Generator) -> FFN:
    """OLMoE: each entry independently replaced by N(0, std^2) with probability `ratio`."""
    out = []
    for w in ffn:
        mask = torch.rand(w.shape, generator=gen) < ratio
        noise = torch.randn(w.shape, generator=gen) * std
        out.append(torch.where(mask, noise, w))
    return tuple(out)  # type: ignore[return-value]


def add_neuronwise(ffn: FFN, ratio: float, std: float, gen: torch.Generator) -> FFN:
    """Drop-Upcycling's baseline: N(0, std^2) added to floor(ratio·f) neurons, an independent set per matrix."""
    g, u, d = (t.clone() for t in ffn)
    f = g.shape[0]
    k = n_dropped(ratio, f)
    for w, axis in ((g, 0), (u, 0), (d, 1)):
        s = torch.randperm(f, generator=gen)[:k]
        if axis == 0:
            w[s] += torch.randn(w[s].shape, generator=gen) * std
        else:
            w[:, s] += torch.randn(w[:, s].shape, generator=gen) * std
    return g, u, d


_VARIANTS = {"replace_elementwise": replace_elementwise, "add_neuronwise": add_neuronwise}


def configure(cfg: ModelConfig, spec: UpcycleSpec) -> ModelConfig:
    """Experts are edited copies of the FFN: naive's shape rule."""
    return naive.configure(cfg, spec)


def build(
    dense_sd: dict[str, torch.Tensor],
    cfg: ModelConfig,
    spec: UpcycleSpec,
    calibration_tokens: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    noisy = _VARIANTS[spec.noise_variant]
    layers = []
    for l in range(cfg.n_layer):
        ffn = dense_ffn(dense_sd, l)
        experts = [
            noisy(ffn, spec.noise_ratio, spec.noise_std, seeded_generator(spec.seed, _NOISE_STREAM, l, e))
            for e in range(cfg.n_expert)
        ]
        layers.append(LayerMoE(experts, fresh_router(cfg, spec.seed, l)))
    return assemble(dense_sd, cfg, layers)
