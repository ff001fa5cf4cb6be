"""Router Upcycling (Ran et al., arXiv 2509.00679, §3.2-3.3; docs/methods.md): experts are copies, the router is a
mixture of m routers initialised from the preceding attention layer, with m = n (the paper's best setting, §5.2.1).

Per layer, with d' = d_model/m: split the attention into u = max(m, h) units of d/u query/key dimensions (heads; or,
when m > h, each head split into m/h parts, as the paper's m=32-from-16-heads variant). K_A = each unit's average
attention key, W_K x averaged over the calibration tokens x at the attention input (pre-RoPE: averaging rotated keys
over positions would mix RoPE's frequency pairs). Units are merged into m groups of u/m by the similarity of their
K_A (balanced k-means on the normalised average keys; the paper merges the most cosine-similar heads). Router j's
query projection W^j is the W_Q rows of group j; expert i's key K_i is the concatenated K_A of group i (Eqs. 4-5),
so experts differ because their head groups do. Scores S_i = Σ_j (W^j x)·K_i / √d' (Eqs. 7-8), no normalisation,
softmax and top-k on top: a linear router at any weights (`workers.model.MixtureRouter`). Routing uses no RoPE.
The model has no GQA (the paper's architecture), so each query head has its own key head. Copies + DeepSpeed's
renormalised top-k (k >= 2) reproduce the dense function for any router (Identity B).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from upscale.sweeps.segments import UpcycleSpec
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, seeded_generator
from upscale.workers.upcycling import naive
from upscale.workers.upcycling.adapter import LayerMoE, assemble, attention, dense_ffn
from upscale.workers.upcycling.calibration import attention_inputs, check_tokens
from upscale.workers.upcycling.clustering import kmeans

_GROUP_STREAM = 6


def configure(cfg: ModelConfig, spec: UpcycleSpec) -> ModelConfig:
    """Copied experts (naive's shape rule) and a mixture router of m = n_expert routers, one key per expert."""
    cfg = naive.configure(cfg, spec)
    m = spec.n_routers or cfg.n_expert
    if m != cfg.n_expert:
        raise WorkerError(
            f"router-upcycling gives expert i the key of head group i, so it needs n_routers = n_expert "
            f"(the paper's best setting); got n_routers={m}, n_expert={cfg.n_expert}"
        )
    return cfg.updated(router_type="mixture", n_routers=m)


def head_groups(avg_keys: torch.Tensor, m: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Unit ids of each of m groups: the units themselves when there are m, else balanced k-means on the
    normalised average keys [u, d/u] (groups of u/m most similar units), each group sorted."""
    u = avg_keys.shape[0]
    if u == m:
        return [torch.tensor([i]) for i in range(m)]
    labels = kmeans(F.normalize(avg_keys.double(), dim=1), m, gen, balanced=True)
    return [torch.nonzero(labels == j).flatten() for j in range(m)]


def mixture_router(
    wq: torch.Tensor, wk: torch.Tensor, x: torch.Tensor, m: int, n_head: int, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """`queries` [m, d', d] (W_Q rows of each group) and `keys` [m, d'] (each group's average key) from the
    attention weights and its inputs x [N, d]."""
    d = wq.shape[1]
    u = max(m, n_head)
    avg = (x @ wk.T).mean(0).view(u, d // u)  # each unit's average key, no RoPE
    groups = head_groups(avg, m, gen)
    units = wq.view(u, d // u, d)
    return {
        "queries": torch.stack([units[g].reshape(-1, d) for g in groups]),
        "keys": torch.stack([avg[g].reshape(-1) for g in groups]),
    }


def build(
    dense_sd: dict[str, torch.Tensor],
    cfg: ModelConfig,
    spec: UpcycleSpec,
    calibration_tokens: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    tokens = check_tokens(calibration_tokens, cfg, "router-upcycling")
    inputs = attention_inputs(dense_sd, cfg, tokens)
    layers = []
    for l in range(cfg.n_layer):
        router = mixture_router(
            attention(dense_sd, cfg, l, "wq"), attention(dense_sd, cfg, l, "wk"), inputs[l], cfg.routers, cfg.n_head,
            seeded_generator(spec.seed, _GROUP_STREAM, l),
        )
        layers.append(LayerMoE(naive.copies(dense_ffn(dense_sd, l), cfg.n_expert), router))
    return assemble(dense_sd, cfg, layers)
