"""Validation loss on the fixed held-out token set, and per-expert load statistics of the last forward pass."""

from __future__ import annotations

import torch

from upscale.workers.engine import lm_loss
from upscale.workers.model import UpscaleLM
from upscale.workers.parallel import SINGLE, Ranks


@torch.no_grad()
def val_loss(model: torch.nn.Module, batches: list[torch.Tensor], device: str, ranks: Ranks = SINGLE) -> float:
    """Mean next-token cross-entropy over every predicted token of `batches` (eval mode, restored after).

    On several ranks each evaluates its rows of every batch and the sums are reduced; a last batch too short to
    split evenly is evaluated whole by every rank (each forward is a collective for an expert-parallel MoE) and
    counted once."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for b in batches:
            even = b.shape[0] % ranks.world == 0
            rows = ranks.rows(b) if even else b
            ce, _ = lm_loss(model, rows, device)
            if even or ranks.main:
                n = rows[:, 1:].numel()
                total += float(ce) * n
                count += n
    finally:
        model.train(was_training)
    if ranks.world > 1:
        total, count = ranks.sum(torch.tensor([total, count], dtype=torch.float64)).tolist()
    return total / count


def reduce_expert_counts(model: UpscaleLM, ranks: Ranks) -> None:
    """Sum the last forward's per-expert token counts over ranks (each rank routed only its own tokens)."""
    if ranks.world > 1 and model.expert_counts:
        model.expert_counts = [ranks.sum(c) for c in model.expert_counts]


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
