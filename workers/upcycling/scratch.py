"""From scratch: a randomly initialised MoE of the same shape, the baseline every upcycling method is compared to.

The dense checkpoint is ignored on purpose (only its shape matters, checked by the registry); the weights are
exactly `build_model(cfg, spec.seed)`, so a scratch run and a training job that builds its own model agree.
"""

from __future__ import annotations

import torch

from upscale.sweeps.segments import UpcycleSpec
from upscale.workers.model import ModelConfig, build_model


def configure(cfg: ModelConfig, spec: UpcycleSpec) -> ModelConfig:
    """Any MoE shape: the baseline is trained as configured."""
    return cfg


def build(
    dense_sd: dict[str, torch.Tensor],
    cfg: ModelConfig,
    spec: UpcycleSpec,
    calibration_tokens: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    dtype = dense_sd["tok_emb.weight"].dtype
    return {k: v.to(dtype) for k, v in build_model(cfg, spec.seed).state_dict().items()}
