"""LLaMA-MoE expert construction (Zhu et al., EMNLP 2024; pjlab-sys4nlp/llama-moe; docs/methods.md): split the FFN.

Each expert is a slice of the dense FFN's neurons (rows of W_gate/W_up, columns of W_down; Identity A), chosen by
`spec.split`:

* `independent-random`: labels [0..n-1] * (f/n), shuffled (RandomSplit); experts partition the neurons.
* `independent-clustering`: balanced k-means (equal sizes f/n) on the L2-normalised rows of W_up (ClusteringSplit,
  `proj_type=up_proj`).
* `sharing-inner`: calibration sequences are grouped into n clusters; expert i = the f/n neurons with the largest
  Taylor importance for group i (`split_with_neuron_sharing`, criterion max). Experts may overlap; some neurons
  may be in no expert.
* `sharing-inter` (GradientSplitResidual): with n routed and n_res residual experts of size m = f/(n + n_res),
  repeatedly move the neurons that appear in the most routed experts' top-m lists into the residual pool until it
  holds n_res·m; the pool becomes an always-on shared expert (the n_res residual experts side by side, which is
  the same function); the remaining n·m neurons are assigned greedily and disjointly (highest remaining
  (expert, neuron) importance first; `share_neurons=False`), so shared + routed partition the FFN.

Gate: LLaMA-MoE's MLP gate Linear(d, n) -> tanh -> Linear(n, n) (`llama_gate="mlp"`, default) or a linear router,
freshly drawn N(0, 0.02^2) on every layer as the official code does (`llama_gate_init="official"`, default) or with
the model's `router_init` (`"model"`; N(0, 2/(5 d)) on the n x n output layer is std ~0.2 for 8 experts); top-k,
softmax over the selected logits and DeepSpeed's balance loss (the noisy gate's training-time noise and its CV²
loss are not reproduced). The score scale s (default n/k, the CPT docs) is folded into W_down of the routed
experts, which is exact (Identity A, docs/methods.md). s = n/k is a magnitude heuristic: no partitioned MoE with
top-k < n reproduces the dense function.
"""

from __future__ import annotations

import torch

from upscale.sweeps.segments import UpcycleSpec
from upscale.sweeps.sizes import expert_widths
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, seeded_generator
from upscale.workers.upcycling.adapter import FFN, LayerMoE, assemble, dense_ffn, fresh_router
from upscale.workers.upcycling.calibration import check_tokens, ffn_importance, sequence_groups
from upscale.workers.upcycling.clustering import kmeans

_SPLIT_STREAM = 4


def configure(cfg: ModelConfig, spec: UpcycleSpec) -> ModelConfig:
    """Experts of width f/n (f/(n + n_residual) with a shared residual expert for sharing-inter); the chosen gate."""
    try:
        expert_d_ff, shared_d_ff = expert_widths(spec, cfg.d_ff, cfg.n_expert, cfg.topk)
    except ValueError as e:
        raise WorkerError(str(e)) from None
    router_init = "normal_0.02" if spec.llama_gate_init == "official" else cfg.router_init
    return cfg.updated(expert_d_ff=expert_d_ff, shared_d_ff=shared_d_ff, router_type=spec.llama_gate, n_routers=0,
                       router_init=router_init)


def random_split(f: int, n: int, gen: torch.Generator) -> list[torch.Tensor]:
    """RandomSplit: a shuffled balanced labelling; expert i = sorted neuron ids labelled i."""
    labels = torch.arange(n).repeat(f // n)[torch.randperm(f, generator=gen)]
    return [torch.nonzero(labels == i).flatten() for i in range(n)]


def clustering_split(w_up: torch.Tensor, n: int, gen: torch.Generator) -> list[torch.Tensor]:
    """ClusteringSplit: balanced k-means of the L2-normalised rows of W_up into n clusters of f/n."""
    labels = kmeans(torch.nn.functional.normalize(w_up.double(), dim=1), n, gen, balanced=True)
    return [torch.nonzero(labels == i).flatten() for i in range(n)]


def sharing_inner(importance: torch.Tensor, m: int) -> list[torch.Tensor]:
    """Expert i = the m neurons of largest importance[i] (sorted ids); overlaps allowed."""
    return [torch.topk(v, m).indices.sort().values for v in importance]


def sharing_inter(importance: torch.Tensor, m: int, n_residual: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(residual neuron ids [n_residual·m], routed experts' disjoint neuron ids [m each]) from importance [n, f]."""
    n, f = importance.shape
    free = torch.ones(f, dtype=torch.bool)
    pool: list[int] = []
    total = importance.sum(0)
    while len(pool) < n_residual * m:
        masked = importance.masked_fill(~free, float("-inf"))
        tops = torch.topk(masked, m, dim=1).indices
        counts = torch.bincount(tops.flatten(), minlength=f)
        best = torch.nonzero(counts == counts.max()).flatten()
        best = best[torch.argsort(total[best], descending=True, stable=True)]
        for j in best[: n_residual * m - len(pool)].tolist():
            pool.append(j)
            free[j] = False
    order = torch.argsort(importance.flatten(), descending=True, stable=True).tolist()
    routed: list[list[int]] = [[] for _ in range(n)]
    for flat in order:
        i, j = divmod(flat, f)
        if free[j] and len(routed[i]) < m:
            routed[i].append(j)
            free[j] = False
    return torch.tensor(sorted(pool)), [torch.tensor(sorted(r)) for r in routed]


def take(ffn: FFN, idx: torch.Tensor, scale: float) -> FFN:
    """The sub-FFN of neurons `idx`, with its output scaled by `scale` (on W_down)."""
    g, u, d = ffn
    return g[idx].clone(), u[idx].clone(), d[:, idx] * scale


def build(
    dense_sd: dict[str, torch.Tensor],
    cfg: ModelConfig,
    spec: UpcycleSpec,
    calibration_tokens: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    n, m = cfg.n_expert, cfg.d_expert
    scale = spec.score_scale if spec.score_scale is not None else n / cfg.topk
    importance = None
    if spec.split in ("sharing-inner", "sharing-inter"):
        tokens = check_tokens(calibration_tokens, cfg, f"llama-moe {spec.split}")
        groups = sequence_groups(dense_sd, tokens, n, spec.seed)
        importance = ffn_importance(dense_sd, cfg, tokens, groups, n)
    layers = []
    for l in range(cfg.n_layer):
        ffn = dense_ffn(dense_sd, l)
        gen = seeded_generator(spec.seed, _SPLIT_STREAM, l)
        shared = None
        if spec.split == "independent-random":
            sets = random_split(cfg.d_ff, n, gen)
        elif spec.split == "independent-clustering":
            sets = clustering_split(ffn[1], n, gen)
        elif spec.split == "sharing-inner":
            assert importance is not None
            sets = sharing_inner(importance[l], m)
        else:
            assert importance is not None
            residual, sets = sharing_inter(importance[l], m, spec.n_residual)
            shared = take(ffn, residual, 1.0)
        layers.append(LayerMoE([take(ffn, s, scale) for s in sets], fresh_router(cfg, spec.seed, l), shared))
    return assemble(dense_sd, cfg, layers)
