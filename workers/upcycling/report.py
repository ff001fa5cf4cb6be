"""What an upcycled MoE kept from its dense model: function preservation, re-initialised and intact neurons.

* `max_abs_logit_diff`: max |dense logits - MoE logits| on a fixed batch (seeded random tokens), fp32, eval mode.
* `reinit_fraction[m]` for m in gate/up/down: the fraction of expert neurons (rows of W_gate/W_up, columns of
  W_down, over every expert, the shared expert and every layer) whose vector matches no neuron of the dense FFN
  of that layer. Matching is by direction (cosine > 1 - 1e-6, float64), so the exact output scales folded into
  W_down by llama-moe and granular still count as intact.
* `intact_neuron_fraction`: the fraction of expert neurons whose three vectors all match the *same* dense neuron.
* `experts_distinct`: every pair of experts of every layer differs (naive copies: False).
* `params`: N1, N2, N_total of the MoE (non-embedding).
* `expansion_report`: the same function check for an expanded MoE against its MoE parent (max_abs_logit_diff),
  with both models' expert counts and parameters.
* `init`: what was used: the routing, the router network and its init, and the method's own init options (drop:
  `index_mode`, shared = the paper's one index set, per_matrix = the official code's; llama-moe: `gate_init`).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F

from upscale.sweeps.segments import UpcycleSpec
from upscale.workers.model import ModelConfig, seeded_generator
from upscale.workers.upcycling.adapter import FFN, dense_ffn, experts_of, shared_of
from upscale.workers.weights import instantiate

_MATRICES = ("gate", "up", "down")
_PROBE_STREAM = 7


def probe_tokens(cfg: ModelConfig, batch: int = 4, length: int = 64) -> torch.Tensor:
    """The fixed batch the logit difference is measured on (same for every method and run)."""
    gen = seeded_generator(0, _PROBE_STREAM)
    return torch.randint(0, cfg.vocab_size, (batch, min(length, cfg.context)), generator=gen)


def _neurons(ffn: FFN) -> tuple[torch.Tensor, ...]:
    # one row per neuron for each matrix, unit length
    g, u, d = ffn
    return tuple(F.normalize(t.double(), dim=1) for t in (g, u, d.T))


def neuron_matches(dense: FFN, experts: list[FFN]) -> tuple[torch.Tensor, torch.Tensor]:
    """For every expert neuron: matched[3, n] per matrix, and intact[n] (all three match one dense neuron)."""
    ref = _neurons(dense)
    got = [torch.cat(parts) for parts in zip(*(_neurons(e) for e in experts), strict=True)]
    matched, index = [], []
    for r, g in zip(ref, got, strict=True):
        # in row chunks: all experts x all dense neurons at once is n·f x f doubles (~2 GB for the 1B size)
        best, arg = zip(*((c @ r.T).max(dim=1) for c in g.split(4096)), strict=True)
        matched.append(torch.cat(best) > 1 - 1e-6)
        index.append(torch.cat(arg))
    m = torch.stack(matched)
    intact = m.all(0) & (index[0] == index[1]) & (index[1] == index[2])
    return m, intact


@torch.no_grad()
def upcycle_report(
    spec: UpcycleSpec,
    dense_cfg: ModelConfig,
    dense_sd: dict[str, torch.Tensor],
    moe_cfg: ModelConfig,
    moe_sd: dict[str, torch.Tensor],
) -> dict[str, Any]:
    """The report (`upscale upcycle --json`) for one upcycled model (keys: method, max_abs_logit_diff, reinit_fraction,
    intact_neuron_fraction, experts_distinct, params, init)."""
    dense = instantiate(dense_cfg, {k: v.float() for k, v in dense_sd.items()}).eval()
    moe = instantiate(moe_cfg, {k: v.float() for k, v in moe_sd.items()}).eval()
    tokens = probe_tokens(dense_cfg)
    diff = (dense(tokens)[0] - moe(tokens)[0]).abs().max().item()
    matched, intact, distinct = [], [], True
    for l in range(moe_cfg.n_layer):
        experts = experts_of(moe_sd, moe_cfg, l)
        distinct &= all(
            any(not torch.equal(a, b) for a, b in zip(x, y, strict=True)) for x, y in itertools.combinations(experts, 2)
        )
        shared = shared_of(moe_sd, l)
        m, i = neuron_matches(dense_ffn(dense_sd, l), experts + ([shared] if shared is not None else []))
        matched.append(m)
        intact.append(i)
    m = torch.cat(matched, dim=1).double()
    return {
        "method": spec.method,
        "max_abs_logit_diff": diff,
        "reinit_fraction": {name: 1.0 - m[j].mean().item() for j, name in enumerate(_MATRICES)},
        "intact_neuron_fraction": torch.cat(intact).double().mean().item(),
        "experts_distinct": distinct,
        "params": {"n1": moe.n1(), "n2": moe.n2(), "n_total": moe.n_total()},
        "init": init_used(spec, moe_cfg),
    }


def init_used(spec: UpcycleSpec, cfg: ModelConfig) -> dict[str, str]:
    """Routing, router and init options the MoE was built with (the method's own options only where it has any)."""
    used = {"routing": cfg.routing, "router_type": cfg.router_type, "router_init": cfg.router_init}
    if spec.method == "drop":
        used["index_mode"] = spec.index_mode
    if spec.method == "llama-moe":
        used["gate_init"] = spec.llama_gate_init
    return used


@torch.no_grad()
def expansion_report(
    parent_cfg: ModelConfig,
    parent_sd: dict[str, torch.Tensor],
    cfg: ModelConfig,
    sd: dict[str, torch.Tensor],
) -> dict[str, Any]:
    """The report (`upscale model expand --json`) for one expanded model (keys: n_expert, topk, max_abs_logit_diff,
    params), each model's figures as [parent, expanded]."""
    models = [instantiate(c, {k: v.float() for k, v in s.items()}).eval() for c, s in ((parent_cfg, parent_sd),
                                                                                        (cfg, sd))]
    tokens = probe_tokens(parent_cfg)
    parent, expanded = (m(tokens)[0] for m in models)
    return {
        "n_expert": [parent_cfg.n_expert, cfg.n_expert],
        "topk": [parent_cfg.topk, cfg.topk],
        "max_abs_logit_diff": (parent - expanded).abs().max().item(),
        "params": {"n2": [m.n2() for m in models], "n_total": [m.n_total() for m in models]},
    }
