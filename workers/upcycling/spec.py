"""What an upcycling run is asked to do: the method name and its options, one frozen model for all methods.

Kept apart from the registry so the method modules can import it without a cycle. Defaults are the papers'
(METHODS.md): r = 0.5 with a shared index set (Drop-Upcycling), OLMoE's element-wise replacement with ratio 0.5
and std 0.02, LLaMA-MoE's Independent-Random split with its MLP gate and the N/k score scale, m = n routers.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Method = Literal["naive", "drop", "noise", "llama-moe", "router-upcycling", "granular", "scratch"]
Split = Literal["independent-random", "independent-clustering", "sharing-inner", "sharing-inter"]


class UpcycleSpec(BaseModel):
    """One method and its options; fields a method does not use are ignored by it (and recorded in lineage)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Method = Field(description="construction method (METHODS.md)")
    r: float = Field(default=0.5, ge=0.0, le=1.0, description="drop: fraction of FFN neurons re-initialised")
    index_mode: Literal["shared", "per_matrix"] = Field(
        default="shared",
        description="drop: one index set for W_gate/W_up/W_down (paper) or one per matrix (official code)",
    )
    noise_variant: Literal["replace_elementwise", "add_neuronwise"] = Field(
        default="replace_elementwise",
        description="noise: OLMoE's element-wise replacement, or Drop-Upcycling's baseline adding to neurons",
    )
    noise_ratio: float = Field(default=0.5, ge=0.0, le=1.0, description="noise: fraction of entries/neurons hit")
    noise_std: float = Field(default=0.02, ge=0.0, description="noise: std of the noise")
    split: Split = Field(default="independent-random", description="llama-moe: how the FFN neurons are split")
    llama_gate: Literal["mlp", "linear"] = Field(
        default="mlp", description="llama-moe: router network (LLaMA-MoE's default is the tanh MLP gate)"
    )
    score_scale: float | None = Field(
        default=None, gt=0.0, description="llama-moe: expert output scale folded into W_down; None = n_expert/topk"
    )
    n_residual: int = Field(default=1, ge=1, description="llama-moe sharing-inter: always-on residual experts")
    granularity: int = Field(default=2, ge=1, description="granular: G = dense d_ff / expert d_ff")
    n_routers: int = Field(default=0, ge=0, description="router-upcycling: routers m; 0 = n_expert (paper's best)")
