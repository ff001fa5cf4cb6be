"""Router Upcycling (Ran et al., arXiv 2509.00679; METHODS.md §5): experts are copies, the router is a mixture of
m routers initialised from the preceding attention layer.

Per layer, with d' = d_model/m: router j's query projection is the block of W_Q rows of head group j
(rows j·d' .. (j+1)·d'; no RoPE: routing must not depend on position); expert i's key K_i^j is the average of
W_K^j x over the calibration tokens x associated with expert i. Those sets come from k-means (n clusters) over the
collected keys W_K x, because keys averaged over the *same* tokens would tie every expert (METHODS.md §5). The
router inputs x are collected where the router sits, at the FFN input after the post-attention RMSNorm.
score_i(x) = Σ_j (W^j x)·K_i^j / √d' (the paper's Eq. 8, summed without a non-linearity): a linear router at any
weights with W_eff[i] = Σ_j K_i^j W^j / √d' (`workers.model.MixtureRouter`); what changes is the parameterisation.
The model has no GQA (the paper's architecture), so kv head = query head. Copies + DeepSpeed's renormalised
top-k (k >= 2) reproduce the dense function for any router (Identity B).
"""

from __future__ import annotations

import torch

from sweeps.segments import UpcycleSpec
from workers.model import ModelConfig, seeded_generator
from workers.upcycling import naive
from workers.upcycling.adapter import LayerMoE, assemble, attention, dense_ffn
from workers.upcycling.calibration import check_tokens, ffn_inputs
from workers.upcycling.clustering import kmeans

_KEY_STREAM = 6


def configure(cfg: ModelConfig, spec: UpcycleSpec) -> ModelConfig:
    """Copied experts (naive's shape rule) and a mixture router of m = spec.n_routers or n_expert routers."""
    cfg = naive.configure(cfg, spec)
    return cfg.updated(router_type="mixture", n_routers=spec.n_routers or cfg.n_expert)


def mixture_router(
    wq: torch.Tensor, wk: torch.Tensor, x: torch.Tensor, n_expert: int, m: int, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """`queries` [m, d', d] from W_Q and `keys` [n, m, d'] = per-cluster mean of W_K x over router inputs x [N, d]."""
    d = wq.shape[1]
    keys = x @ wk.T  # [N, d]: every token's key, all heads, no RoPE
    labels = kmeans(keys, n_expert, gen)
    centroids = torch.stack([keys[labels == i].mean(0) for i in range(n_expert)])
    return {"queries": wq.reshape(m, d // m, d).clone(), "keys": centroids.reshape(n_expert, m, d // m)}


def build(
    dense_sd: dict[str, torch.Tensor],
    cfg: ModelConfig,
    spec: UpcycleSpec,
    calibration_tokens: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    tokens = check_tokens(calibration_tokens, cfg, "router-upcycling")
    inputs = ffn_inputs(dense_sd, cfg, tokens)
    layers = []
    for l in range(cfg.n_layer):
        router = mixture_router(
            attention(dense_sd, l, "wq"), attention(dense_sd, l, "wk"), inputs[l], cfg.n_expert, cfg.routers,
            seeded_generator(spec.seed, _KEY_STREAM, l),
        )
        layers.append(LayerMoE(naive.copies(dense_ffn(dense_sd, l), cfg.n_expert), router))
    return assemble(dense_sd, cfg, layers)
