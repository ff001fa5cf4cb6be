"""Validation loss on the fixed held-out token set, and per-expert load statistics of the last forward pass."""

from __future__ import annotations

import torch

from workers.engine import lm_loss
from workers.model import UpscaleLM


@torch.no_grad()
def val_loss(model: torch.nn.Module, batches: list[torch.Tensor], device: str) -> float:
    """Mean next-token cross-entropy over every predicted token of `batches` (eval mode, restored after)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for b in batches:
            ce, _ = lm_loss(model, b, device)
            n = b[:, 1:].numel()
            total += float(ce) * n
            count += n
    finally:
        model.train(was_training)
    return total / count


def expert_load(model: UpscaleLM) -> dict[str, float]:
    """Per-layer, per-expert share of routed tokens, and the mean max/mean imbalance (1 = perfectly balanced)."""
    counts = model.expert_counts
    if not counts:
        return {}
    out: dict[str, float] = {}
    imbalance = 0.0
    for layer, c in enumerate(counts):
        share = c.float() / c.float().sum().clamp_min(1)
        for e, s in enumerate(share.tolist()):
            out[f"load/layer{layer}/expert{e}"] = s
        imbalance += float(share.max() * len(share))
    out["load_max_over_mean"] = imbalance / len(counts)
    return out
