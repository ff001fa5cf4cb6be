"""Naive (vanilla) sparse upcycling, Komatsuzaki et al.: every expert is an exact copy of the dense FFN.

Everything but the FFNs is copied; each layer gets a fresh router drawn exactly as `build_model` draws it
(cfg.router_init, default N(0, 2/(5 d_model)), the upcycling-scaling-laws paper's A.6). With the renormalised top-k
(`routing="softmax_topk"`, every k; DeepSpeed's routing for k >= 2) and no token dropping the MoE computes the dense
function exactly (docs/methods.md, "Two identities"); DeepSpeed's top-1 (`routing="deepspeed"`) does not
renormalise, so there k = 1 scales every FFN output by p_max.
"""

from __future__ import annotations

import torch

from upscale.sweeps.segments import UpcycleSpec
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig
from upscale.workers.upcycling.adapter import FFN, LayerMoE, assemble, dense_ffn, fresh_router


def copies(ffn: FFN, n_expert: int) -> list[FFN]:
    """n independent copies (clones, so later in-place edits of one expert never touch another)."""
    return [tuple(t.clone() for t in ffn) for _ in range(n_expert)]  # type: ignore[misc]


def configure(cfg: ModelConfig, spec: UpcycleSpec) -> ModelConfig:
    """Copy-based methods (naive, drop, noise) need experts as wide as the dense FFN and no shared expert."""
    if cfg.d_expert != cfg.d_ff or cfg.shared_d_ff:
        raise WorkerError(
            f"{spec.method} upcycling copies the FFN: it needs expert_d_ff = d_ff = {cfg.d_ff} and no shared "
            f"expert; got expert_d_ff={cfg.d_expert}, shared_d_ff={cfg.shared_d_ff}"
        )
    return cfg


def build(
    dense_sd: dict[str, torch.Tensor],
    cfg: ModelConfig,
    spec: UpcycleSpec,
    calibration_tokens: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    layers = [
        LayerMoE(copies(dense_ffn(dense_sd, l), cfg.n_expert), fresh_router(cfg, spec.seed, l))
        for l in range(cfg.n_layer)
    ]
    return assemble(dense_sd, cfg, layers)
