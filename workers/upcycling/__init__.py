"""Dense -> MoE construction methods: one module per method, one registry, one entry point (docs/methods.md).

`upcycle(dense_sd, moe_cfg, spec, calibration_tokens=None) -> (cfg, moe_sd)` is what training segments and the CLI
call. Every method module exposes two pure functions:

* `configure(moe_cfg, spec) -> ModelConfig`: the MoE shape the method builds (granular narrows the experts,
  llama-moe splits the FFN and picks its gate, router-upcycling switches to a mixture router), or a WorkerError
  naming the option that cannot work with this shape;
* `build(dense_sd, cfg, spec, calibration_tokens) -> moe_sd`: the tensor math, seeded by `spec.seed` only.

Methods that need data (llama-moe's sharing splits, router-upcycling) take calibration tokens [B, T] and raise a
WorkerError without them. The registry is checked at import against `sweeps.segments.Method`, the names a sweep
may use.

`expand(parent_sd, parent_cfg, spec, calibration_tokens=None, topk=None) -> (cfg, moe_sd)` is the one MoE -> MoE
operator (workers/upcycling/expansion.py, an `ExpandSpec`): it grows a trained MoE's experts m-fold, top-k kept.
"""

from __future__ import annotations

from types import ModuleType
from typing import get_args

import torch

from upscale.sweeps.segments import ExpandSpec, Method, UpcycleSpec
from upscale.workers.errors import WorkerError, validated
from upscale.workers.model import ModelConfig
from upscale.workers.upcycling import drop, expansion, granular, llama_moe, naive, noise, router_upcycling, scratch
from upscale.workers.weights import check_state_dict

METHODS: dict[str, ModuleType] = {
    "naive": naive,
    "drop": drop,
    "noise": noise,
    "llama-moe": llama_moe,
    "router-upcycling": router_upcycling,
    "granular": granular,
    "scratch": scratch,
}
assert set(METHODS) == set(get_args(Method)), "registry and sweeps.segments.Method disagree"


def method_spec(method: str, **options: object) -> UpcycleSpec:
    """An UpcycleSpec from user input: an unknown method or a bad option is one WorkerError line."""
    if method not in METHODS:
        raise WorkerError(f"unknown upcycling method {method!r}; valid methods: {', '.join(METHODS)}")
    return validated(UpcycleSpec, method=method, **options)


def upcycle(
    dense_sd: dict[str, torch.Tensor],
    moe_cfg: ModelConfig,
    spec: UpcycleSpec,
    calibration_tokens: torch.Tensor | None = None,
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Build the MoE `spec` describes from a dense state dict; returns the MoE's (adjusted) config and weights."""
    module = METHODS[spec.method]  # spec.method is a validated Method, and METHODS covers every one (checked above)
    if not moe_cfg.is_moe:
        raise WorkerError(f"upcycling needs an MoE config (n_expert >= 2); got n_expert={moe_cfg.n_expert}")
    cfg = module.configure(moe_cfg, spec)
    check_state_dict(cfg.dense(), dense_sd, what="dense checkpoint")
    moe_sd = module.build(dense_sd, cfg, spec, calibration_tokens)
    check_state_dict(cfg, moe_sd, what=f"{spec.method} output")
    return cfg, moe_sd


def expand(
    parent_sd: dict[str, torch.Tensor],
    parent_cfg: ModelConfig,
    spec: ExpandSpec,
    calibration_tokens: torch.Tensor | None = None,
    topk: int | None = None,
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The m·E-expert MoE grown from a trained MoE's state dict; returns its config and weights."""
    cfg = expansion.configure(parent_cfg, spec, topk)
    check_state_dict(parent_cfg, parent_sd, what=f"parent checkpoint (an MoE of n_expert={parent_cfg.n_expert})")
    moe_sd = expansion.build(parent_sd, parent_cfg, cfg, spec, calibration_tokens)
    check_state_dict(cfg, moe_sd, what="expansion output")
    return cfg, moe_sd
