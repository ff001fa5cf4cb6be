"""Expert upcycling (Dwivedi et al., arXiv 2604.19835): a trained E-expert MoE grown to m·E experts, top-k kept.

Per MoE layer every parent expert e gets c_e >= 1 copies, m·E in all, laid out expert by expert (parent expert e's
copies are contiguous, its first copy first): `uniform` gives c_e = m; `utility` gives one copy each and shares the
other (m-1)·E by largest remainders in proportion to u_e, the parent's mean routing score (softmax over its experts,
before any loss-free bias) on calibration tokens. The mean score, not the load, because loss-free balancing evens
the load by construction while the scores still say which experts the router prefers.

The router's rows (a linear router's `weight`, a mixture router's `keys`) are copied to every replica, so replica
logits tie; under loss-free balancing the replicas after the first get the parent's bias plus N(0, (bias_noise ·
std of the layer's parent bias)^2), the expert-upcycling code's `bias_only` router, which breaks the ties in the
choice only. `r > 0` applies Drop-Upcycling (workers/upcycling/drop.py) to the replicas after the first. Attention,
norms, embeddings and any shared expert are copied.

Optimizer state: none is carried; the expanded MoE starts fresh AdamW moments, as every upcycled model here does (an
upcycle hands over weights only and reads no optimiser shards). The paper's code copies the source expert's moments
by default.

Exactness (docs/methods.md, "Expansion"): at zero noise and r = 0 with top-1 and renormalised weights
(`routing="softmax_topk"`), the expanded model computes the parent's function: the replicas of the parent's chosen
expert hold the largest score (each p_e/m), whichever of them is picked is a copy, and its weight is 1.
"""

from __future__ import annotations

import torch

from upscale.sweeps.segments import ExpandSpec
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, seeded_generator
from upscale.workers.upcycling.adapter import LayerMoE, assemble, bias_of, experts_of, router_of, shared_of
from upscale.workers.upcycling.calibration import check_tokens, routing_scores
from upscale.workers.upcycling.drop import drop_expert

_EXPAND_STREAM = 6  # generator purpose key (routers 1, drop 2, calibration groups 5)
_ROUTER_ROWS = {"linear": "weight", "mixture": "keys"}  # the router tensor with one row per expert


def configure(parent: ModelConfig, spec: ExpandSpec, topk: int | None = None) -> ModelConfig:
    """The expanded model: the parent's with factor·n_expert experts; `topk` (default the parent's) must be the
    parent's, since expansion keeps the compute per token."""
    if not parent.is_moe:
        raise WorkerError(f"parent n_expert={parent.n_expert}: expansion grows an MoE and the parent is dense; "
                          "upcycle a dense model with a dense->MoE method (docs/methods.md)")
    if topk is not None and topk > parent.n_expert:
        raise WorkerError(f"topk={topk} exceeds the parent's n_expert={parent.n_expert}: expansion keeps the "
                          f"parent's top-k ({parent.topk})")
    if topk is not None and topk != parent.topk:
        raise WorkerError(f"topk={topk} differs from the parent's topk={parent.topk}: expansion keeps top-k")
    if parent.router_type not in _ROUTER_ROWS:
        raise WorkerError(f"router_type={parent.router_type!r}: expansion copies router rows, which a linear or "
                          "mixture router has and the tanh-MLP router does not")
    return parent.updated(n_expert=parent.n_expert * spec.factor)


def copies(utility: torch.Tensor, factor: int) -> list[int]:
    """Copies per parent expert: one each, and the other (factor-1)·E in proportion to `utility` [E] (largest
    remainders, ties to the lower index)."""
    n = utility.numel()
    extra = (factor - 1) * n
    share = utility.double() / utility.double().sum() * extra
    base = share.floor().long()
    rest = sorted(range(n), key=lambda e: (-float(share[e] - base[e]), e))[: extra - int(base.sum())]
    base[rest] += 1
    return (base + 1).tolist()


def build(
    parent_sd: dict[str, torch.Tensor],
    parent: ModelConfig,
    cfg: ModelConfig,
    spec: ExpandSpec,
    calibration_tokens: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    if spec.strategy == "utility":
        tokens = check_tokens(calibration_tokens, parent, "expansion with strategy='utility'")
        plans = [copies(u, spec.factor) for u in routing_scores(parent_sd, parent, tokens)]
    else:
        plans = [[spec.factor] * parent.n_expert] * parent.n_layer
    rows = _ROUTER_ROWS[parent.router_type]
    layers = []
    for l, plan in enumerate(plans):
        source = torch.tensor([e for e, c in enumerate(plan) for _ in range(c)])  # parent expert of each new one
        replica = torch.tensor([j > 0 for c in plan for j in range(c)])
        parent_experts = experts_of(parent_sd, parent, l)
        experts = [
            drop_expert(parent_experts[e], spec.r, spec.index_mode, seeded_generator(spec.seed, _EXPAND_STREAM, l, i))
            if replica[i] else tuple(t.clone() for t in parent_experts[e])
            for i, e in enumerate(source.tolist())
        ]
        router = router_of(parent_sd, l)
        router[rows] = router[rows][source].clone()
        bias = b = bias_of(parent_sd, l)
        if b is not None:
            noise = torch.randn(len(source), generator=seeded_generator(spec.seed, _EXPAND_STREAM, l))
            bias = b[source] + noise * replica * spec.bias_noise * (b.std() if b.numel() > 1 else 0.0)
        layers.append(LayerMoE(experts, router, shared_of(parent_sd, l), bias))  # type: ignore[arg-type]
    return assemble(parent_sd, cfg, layers)
