"""The Llama-style decoder that upscale trains, dense or Mixture-of-Experts (DeepSpeed-MoE).

Architecture (upcycling-scaling-laws paper, Appendix A.2/A.3): pre-norm decoder blocks with RMSNorm, RoPE
multi-head attention through `scaled_dot_product_attention(is_causal=True)`, a SwiGLU FFN with d_ff = 4·d_model,
no biases anywhere, untied input embedding and LM head. Imported Llama checkpoints (workers/hf_models.py) may set
the FFN width (`ffn_width`), grouped-query attention (`n_kv_head`: query head h reads K/V head h // (n_head /
n_kv_head), as transformers' `repeat_kv`), tied embeddings (`tie_embeddings`: `lm_head.weight` is
`tok_emb.weight`; both names stay in the state dict), the RMSNorm epsilon and the RoPE base.

The FFN of every block is either dense or a
`deepspeed.moe.layer.MoE` whose experts are SwiGLU FFNs: token-choice top-k, no token dropping
(`drop_tokens=False`), deterministic top-2 (`top2_2nd_expert_sampling=False`), DeepSpeed's load-balancing loss
returned to the caller. `routing` picks the gate's weighting (ModelSpec's field description says how):
"softmax_topk" renormalises DeepSpeed's top-1 weight to 1, "deepspeed" keeps DeepSpeed's own gate. `dispatch="grouped"`
swaps DeepSpeed's capacity-buffer dispatch for workers/dispatch.py's dropless grouped one inside the same `MoE` (same
gate, experts and parameter names); `dispatch="deepspeed"` keeps DeepSpeed's.

Public interface (kept small and stable for the trainer; everything else here is private):

* `ModelConfig` — the segment's `ModelSpec` (sweeps/segments.py: shape, vocab_size, context, n_expert (0 = dense,
  else >= 2), topk, routing, ...) plus the fields an upcycling method sets (expert_d_ff, shared_d_ff, router_type,
  n_routers) and ep_size; `ModelConfig.from_size(size, **overrides)`; `ModelConfig.from_spec(segment_model_spec)`;
  `cfg.dense()` is the dense model of the same trunk.
* `build_model(cfg, seed, device=None, ep_rank=0) -> UpscaleLM`. Same (cfg, seed) -> bit-identical weights, on any
  device and thread count; the global torch RNG is left untouched. `device="meta"` builds without allocating
  (parameter counting of the Table 3 sizes). With `cfg.ep_size` > 1 it builds expert-parallel rank `ep_rank`'s
  experts only, holding exactly their slice of the single-process init. `empty_model(cfg, device)` allocates
  without drawing, for weights loaded next.
* `UpscaleLM.forward(tokens[B, T]) -> (logits[B, T, V], aux_loss)`: aux_loss is the sum over MoE layers of
  DeepSpeed's l_aux (a zero tensor for a dense model); the trainer adds `cfg.aux_loss_weight * aux_loss` (the
  coefficient, or nothing under loss-free balancing, where l_aux is reported only).
  `model.activation_checkpointing = True` recomputes each block in the backward pass (torch.utils.checkpoint,
  non-reentrant) instead of keeping its activations: the same gradients for less memory.
  After a forward, `model.expert_counts` holds one `[n_expert]` tensor per MoE layer (token->expert assignments
  before any dropping, every one of the k choices counted), for load metrics and loss-free balancing:
  `balance_experts(loads)` after each optimiser step nudges every layer's `gate.route_bias` (cfg.balancing =
  "loss_free" only) toward equal load.
* `UpscaleLM.n1() / n2() / n_total()`: non-embedding parameter counts (dense counterpart, active per token,
  all), equal to `sweeps.sizes` for the paper's architecture (the router counted in n2, as Eq. 5);
  `flops_per_token()` the training FLOPs per token with attention.
* `init_router(cfg, generator) -> {name: tensor}` fresh router weights (shared with the upcycling methods),
  `seeded_generator(seed, *keys)` a torch.Generator for one (seed, purpose) pair.

State-dict names (what the upcycling adapter in workers/upcycling/adapter.py reads and writes):
`tok_emb.weight`, `blocks.{l}.attn_norm.weight`, `blocks.{l}.attn.{wq,wk,wv,wo}.weight`,
`blocks.{l}.ffn_norm.weight`, dense `blocks.{l}.ffn.{w_gate,w_up,w_down}.weight`, MoE
`blocks.{l}.ffn.moe.deepspeed_moe.gate.wg.<router params>` and
`blocks.{l}.ffn.moe.deepspeed_moe.experts.deepspeed_experts.{e}.{w_gate,w_up,w_down}.weight`, an optional
always-on shared expert `blocks.{l}.ffn.shared.{w_gate,w_up,w_down}.weight`, `norm.weight`, `lm_head.weight`.

Routers (`router_type`): "linear" (DeepSpeed's `wg`, n_expert x d_model, the paper's router); "mixture" (Router
Upcycling's mixture of m routers: queries `wg.queries[m, d', d]`, one key per expert `wg.keys[n, d']`,
score_i(x) = sum_j (W^j x)·K_i / sqrt(d'), summed with no non-linearity as the paper's Eqs. 7-8, so at any weights
it is the linear router with W_eff[i] = K_i · sum_j W^j / sqrt(d'); the parameterisation, not the function class,
differs); "mlp" (LLaMA-MoE's gate network Linear(d, n) -> tanh -> Linear(n, n)). DeepSpeed's `TopKGate` computes
`linear(x, wg.weight)` inline, so the gate is replaced by `_RouterGate`, a subclass whose logits come from the
router module; the gating functions (top-1/top-2/top-k, capacity, aux loss) are DeepSpeed's own. Loss-free
balancing (`balancing="loss_free"`, docs/methods.md "Loss-free balancing") adds the persistent buffer
`blocks.{l}.ffn.moe.deepspeed_moe.gate.route_bias` [n_expert] to the softmax scores for the top-k choice only; the
chosen experts are weighted by the unbiased scores. Both dispatches call the same gate, so both support it.
"""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn
from torch.utils.checkpoint import checkpoint

from upscale.sweeps import sizes
from upscale.sweeps.segments import FFN_MULT, ModelSpec, Routing
from upscale.workers.errors import WorkerError, validated

RouterType = Literal["linear", "mixture", "mlp"]

# Table 5 of the upcycling-scaling-laws paper: std of the normal init per model size. CPU sizes use 0.02.
_PAPER_INIT_STD = {"15M": 0.035, "44M": 0.029, "0.1B": 0.025, "0.2B": 0.022, "0.5B": 0.019, "1B": 0.016}

# An expert's parameter name: (prefix up to the expert id, the id, the rest); ids are local to an expert-parallel rank.
EXPERT_KEY = re.compile(r"^(.*\.deepspeed_experts\.)(\d+)(\..+)$")


class ModelConfig(ModelSpec):
    """The model a worker builds: a segment's `ModelSpec` (every field of it, described and checked there) plus the
    few fields a segment does not hash. An upcycling method's `configure` sets expert_d_ff, shared_d_ff,
    router_type and n_routers (the method, part of the segment's identity, decides them); ep_size is placement.
    Frozen; a checkpoint records it whole (config.json, the sidecar's model_config)."""

    expert_d_ff: int | None = Field(
        default=None, ge=1, description="intermediate size of one expert; None = d_ff (copy-based upcycling)"
    )
    shared_d_ff: int = Field(
        default=0, ge=0, description="intermediate size of an always-on shared expert beside the MoE (0 = none)"
    )
    router_type: RouterType = Field(default="linear", description="linear | mixture (Router Upcycling) | mlp")
    n_routers: int = Field(default=0, ge=0, description="routers of a 'mixture' router; 0 = n_expert (paper's m=n)")
    ep_size: int = Field(default=1, ge=1, description="expert-parallel group size (1 = all experts local)")

    @model_validator(mode="before")
    @classmethod
    def _drop_fixed_ffn_mult(cls, data: object) -> object:
        """Configs saved before the FFN width became `Shape.d_ff` record `ffn_mult: 4`; it was never anything else."""
        if isinstance(data, dict) and data.get("ffn_mult") == FFN_MULT:
            data = {k: v for k, v in data.items() if k != "ffn_mult"}
        return data

    @model_validator(mode="after")
    def _check_buildable(self) -> ModelConfig:
        """What this implementation needs beyond ModelSpec's rules (checked first, by ModelSpec's `_check`)."""
        if (self.d_model // self.n_head) % 2:
            raise WorkerError(f"head size d_model/n_head={self.d_model // self.n_head} must be even for RoPE")
        if self.is_moe:
            if self.n_expert % self.ep_size:
                raise WorkerError(f"n_expert={self.n_expert} is not divisible by ep_size={self.ep_size}")
            if self.router_type == "mixture":
                m = self.routers
                if self.d_model % m or (self.n_head % m and m % self.n_head):
                    raise WorkerError(
                        f"n_routers={m} must divide d_model={self.d_model} and divide or be a multiple of "
                        f"n_head={self.n_head}"
                    )
        return self

    @classmethod
    def from_size(cls, size: str, **overrides: object) -> ModelConfig:
        """A named size from sweeps/sizes.py (paper Table 3 sizes get Table 5's init std); the vocabulary and context
        default to `upscale model init`'s (4096, 1024)."""
        try:
            shape = sizes.shape_of(size)
        except ValueError as e:
            raise WorkerError(str(e)) from None
        base = {**shape.model_dump(), "vocab_size": 4096, "context": 1024, "init_std": _PAPER_INIT_STD.get(size, 0.02)}
        return validated(cls, **{**base, **overrides})

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> ModelConfig:
        """The model of a segment's hashed architecture: its fields as they are, the others at their defaults."""
        return validated(cls, **spec.model_dump())

    @property
    def d_expert(self) -> int:
        return self.expert_d_ff if self.expert_d_ff is not None else self.d_ff

    @property
    def routers(self) -> int:
        return self.n_routers or self.n_expert

    def updated(self, **changes: object) -> ModelConfig:
        """A copy with `changes`, validated again (pydantic's model_copy does not validate)."""
        return validated(ModelConfig, **{**self.model_dump(), **changes})

    def dense(self) -> ModelConfig:
        """The dense model with this trunk (what an upcycling method starts from)."""
        return self.model_copy(update={"n_expert": 0, "topk": 0, "expert_d_ff": None, "shared_d_ff": 0,
                                       "router_type": "linear", "n_routers": 0, "balancing": "aux_loss"})


def seeded_generator(seed: int, *keys: int) -> torch.Generator:
    """A CPU generator for (seed, *keys): independent streams per layer/expert/purpose, order-free."""
    state = np.random.SeedSequence([seed, *keys]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & ((1 << 63) - 1))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in fp32 (Llama's reference does the same) so bf16 training keeps the statistics exact
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class SwiGLU(nn.Module):
    """FFN(x) = W_down (silu(W_gate x) * W_up x); also the expert module DeepSpeed deep-copies."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


def _rope_tables(context: int, d_head: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, computed on the CPU even inside a meta-device build (they are not in the state dict)."""
    inv = 1.0 / theta ** (torch.arange(0, d_head, 2, dtype=torch.float64, device="cpu") / d_head)
    ang = torch.outer(torch.arange(context, dtype=torch.float64, device="cpu"), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Llama's rotate-half convention: pairs (i, i + d_head/2)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_head, self.n_kv_head = cfg.n_head, cfg.kv_heads
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, cfg.d_kv, bias=False)
        self.wv = nn.Linear(d, cfg.d_kv, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q = self.wq(x).view(b, t, self.n_head, -1).transpose(1, 2)
        k, v = (w(x).view(b, t, self.n_kv_head, -1).transpose(1, 2) for w in (self.wk, self.wv))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_head != self.n_head)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class MixtureRouter(nn.Module):
    """Router Upcycling's m routers and one key per expert, scores summed over routers (Ran et al. Eqs. 4-8)."""

    def __init__(self, d_model: int, n_expert: int, n_routers: int) -> None:
        super().__init__()
        d_sub = d_model // n_routers
        self.queries = nn.Parameter(torch.empty(n_routers, d_sub, d_model))
        self.keys = nn.Parameter(torch.empty(n_expert, d_sub))

    @property
    def weight(self) -> torch.Tensor:
        """W_eff[i] = K_i · sum_j W^j / sqrt(d'); computing logits through it is exact and costs n·d per token."""
        d_sub = self.queries.shape[1]
        return self.keys @ self.queries.sum(0) / math.sqrt(d_sub)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.float())


class MLPRouter(nn.Module):
    """LLaMA-MoE's gate network (`gate_network="mlp"`): Linear(d, n) -> tanh -> Linear(n, n), no biases."""

    def __init__(self, d_model: int, n_expert: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, n_expert, bias=False)
        self.out = nn.Linear(n_expert, n_expert, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(torch.tanh(F.linear(x, self.proj.weight.float())), self.out.weight.float())


class LinearRouter(nn.Module):
    """DeepSpeed's router (`wg.weight`, n x d) with the logits computed the way TopKGate does (fp32: the gate runs
    it with autocast off)."""

    def __init__(self, d_model: int, n_expert: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_expert, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.float())


def _make_router(cfg: ModelConfig) -> nn.Module:
    if cfg.router_type == "mixture":
        return MixtureRouter(cfg.d_model, cfg.n_expert, cfg.routers)
    if cfg.router_type == "mlp":
        return MLPRouter(cfg.d_model, cfg.n_expert)
    return LinearRouter(cfg.d_model, cfg.n_expert)


def _router_gate_class() -> type:
    """`TopKGate` with pluggable logits; built lazily so that importing this module does not import DeepSpeed."""
    from deepspeed.moe.sharded_moe import TopKGate, top1gating, top2gating, topkgating

    class _RouterGate(TopKGate):
        routing: Routing = "softmax_topk"
        # loss-free balancing's per-expert bias on the routing scores (a persistent buffer `route_bias`, registered
        # by MoEFFN only when cfg.balancing == "loss_free"), and its update rate
        balancing_rate: float = 0.0

        # Same dispatch as TopKGate.forward in deepspeed 0.19.8, minus timers and Jitter (never enabled here);
        # only the logits come from `self.wg`, which may be any router module. Autocast is off for all of it:
        # under bf16 autocast the router's linear (even on fp32 inputs) and DeepSpeed's gating einsums would run
        # in bf16, and near-tied logits would pick other experts than the fp32 routing the paper specifies.
        def forward(self, input, used_token=None, sparse_routes=False, use_tutel=False):  # type: ignore[override]
            with torch.autocast(input.device.type, enabled=False):
                return self._gate(input.float(), used_token, sparse_routes, use_tutel)

        def _gate(self, x, used_token, sparse_routes, use_tutel):
            logits = self.wg(x)
            bias = getattr(self, "route_bias", None)
            if bias is None:
                return self._gating(logits, used_token, sparse_routes, use_tutel)
            # Loss-free: DeepSpeed chooses on softmax scores + bias (a softmax of them keeps each token's order),
            # then the chosen experts' weights are recomputed from the unbiased scores.
            scores = torch.softmax(logits, dim=-1)
            out = self._gating(scores + bias, used_token, sparse_routes, use_tutel, renormalise_top1=False)
            return _reweighted(out, scores, self.k > 1 or self.routing == "softmax_topk", sparse_routes)

        def _gating(self, logits, used_token, sparse_routes, use_tutel, renormalise_top1=True):
            cf = self.capacity_factor if self.training else self.eval_capacity_factor
            if self.k == 1:
                out = top1gating(logits, cf, self.min_capacity, used_token,
                                 self.noisy_gate_policy if self.training else None, self.drop_tokens,
                                 self.use_rts, self.ep_group, sparse_routes, use_tutel)
                if self.routing == "deepspeed" or not renormalise_top1:
                    return out
                return _renormalised_top1(out, sparse_routes)
            if self.k == 2:
                return top2gating(logits, cf, self.min_capacity, self.drop_tokens, self.ep_group,
                                  self.top2_2nd_expert_sampling, sparse_routes)
            return topkgating(logits, self.k, cf, self.min_capacity, self.drop_tokens, self.ep_group,
                              sparse_routes=sparse_routes)

        @torch.no_grad()
        def balance(self, load: torch.Tensor) -> None:
            """One loss-free update from the step's token counts per expert (summed over micro-batches and ranks):
            b_i += u·sign(mean load - load_i), so under-loaded experts become likelier picks."""
            self.route_bias += self.balancing_rate * torch.sign(load.float().mean() - load.float())

    return _RouterGate


def _reweighted(gate_output: tuple, scores: torch.Tensor, renormalise: bool, sparse_routes: bool) -> tuple:
    """DeepSpeed's gate output for a choice made on biased scores, with the chosen experts' weights replaced by their
    unbiased softmax scores [S, E] (over the chosen k when `renormalise`): the bias picks experts, never weighs them."""
    if sparse_routes:
        l_aux, capacity, n_expert, indices, locations, gates, counts = gate_output
        chosen = indices >= 0
        w = scores.gather(1, indices.clamp(min=0).t().long()).t() * chosen  # [k, S]
        if renormalise:
            w = w / w.sum(0, keepdim=True).clamp(min=torch.finfo(w.dtype).eps)  # DeepSpeed's clamp
        return l_aux, capacity, n_expert, indices, locations, w.to(gates.dtype), counts
    l_aux, combine, dispatch_mask, counts = gate_output
    chosen = dispatch_mask.any(-1)  # [S, E]
    w = scores * chosen
    if renormalise:
        w = w / w.sum(-1, keepdim=True).clamp(min=torch.finfo(w.dtype).eps)
    return l_aux, w.unsqueeze(-1).to(combine.dtype) * dispatch_mask.to(combine.dtype), dispatch_mask, counts


def _renormalised_top1(gate_output: tuple, sparse_routes: bool) -> tuple:
    """DeepSpeed's top-1 output with the chosen expert's weight p/p = 1 (softmax over the top-1 logit); a constant,
    as its exact derivative is zero: the router learns from the load-balancing loss only, as in Mixtral's top-1."""
    if sparse_routes:
        l_aux, capacity, n_expert, indices, locations, gates, counts = gate_output
        return l_aux, capacity, n_expert, indices, locations, (indices >= 0).to(gates.dtype), counts
    l_aux, combine, dispatch_mask, counts = gate_output
    return l_aux, dispatch_mask.to(combine.dtype), dispatch_mask, counts


class MoEFFN(nn.Module):
    """DeepSpeed MoE of SwiGLU experts (+ optional always-on shared expert); returns (y, l_aux, counts)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        from deepspeed.moe.layer import MoE

        self.moe = MoE(
            hidden_size=cfg.d_model,
            expert=SwiGLU(cfg.d_model, cfg.d_expert),
            num_experts=cfg.n_expert,
            ep_size=cfg.ep_size,
            k=cfg.topk,
            capacity_factor=1.0,
            eval_capacity_factor=1.0,
            min_capacity=0,  # top-1 asserts #tokens >= min_capacity even without dropping; nothing is dropped
            drop_tokens=False,
            use_rts=False,
            noisy_gate_policy=None,
            top2_2nd_expert_sampling=False,
        )
        old = self.moe.deepspeed_moe.gate
        gate = _router_gate_class()(
            cfg.d_model, cfg.n_expert, k=cfg.topk, min_capacity=0, drop_tokens=False, use_rts=False,
            top2_2nd_expert_sampling=False,
        )
        gate.wg = _make_router(cfg)
        gate.routing = cfg.routing
        if cfg.balancing == "loss_free":
            # on the CPU even inside empty_model's meta-device build: zeros are its initial value, not a draw
            # (not "expert_…": DeepSpeed saves every MoE tensor whose name holds "expert" as an expert's)
            gate.register_buffer("route_bias", torch.zeros(cfg.n_expert, device="cpu"))
            gate.balancing_rate = cfg.balancing_rate
        assert old.ep_group is None  # the engine sets process groups later, on the gate now in place
        self.moe.deepspeed_moe.gate = gate
        if cfg.dispatch == "grouped":
            from upscale.workers.dispatch import grouped_moe_layer_class

            ds = self.moe.deepspeed_moe  # same gate and experts, so parameter names and groups are unchanged
            self.moe.deepspeed_moe = grouped_moe_layer_class()(
                ds.gate, ds.experts, ds.ep_group_name, ds.ep_size, ds.num_local_experts)
        self.shared = SwiGLU(cfg.d_model, cfg.shared_d_ff) if cfg.shared_d_ff else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y, l_aux, counts = self.moe(x)
        if self.shared is not None:
            y = y + self.shared(x)
        return y, l_aux, counts


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn: nn.Module = MoEFFN(cfg) if cfg.is_moe else SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(output, the MoE's l_aux, its expert counts); None for a dense FFN."""
        x = x + self.attn(self.attn_norm(x), cos, sin)
        h = self.ffn_norm(x)
        if isinstance(self.ffn, MoEFFN):
            y, l_aux, counts = self.ffn(h)
            return x + y, l_aux, counts
        return x + self.ffn(h), None, None


class UpscaleLM(nn.Module):
    """Decoder LM; see the module docstring for the interface."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # _weight skips the default N(0, 1) draw: build_model draws every weight, and on the meta device that one op
        # imports sympy (seconds)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model, _weight=torch.empty(cfg.vocab_size, cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        cos, sin = _rope_tables(cfg.context, cfg.d_model // cfg.n_head, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.expert_counts: list[torch.Tensor] = []
        # Recompute each block's activations in the backward pass instead of keeping them (docs/training.md): set by
        # the trainer, not part of the config, as it changes no result.
        self.activation_checkpointing = False

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = tokens.shape[1]
        if t > self.cfg.context:
            raise WorkerError(f"sequence length {t} exceeds the model context {self.cfg.context}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.tok_emb(tokens)
        aux = torch.zeros((), device=x.device)
        counts: list[torch.Tensor] = []
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        for block in self.blocks:
            if recompute:
                x, l_aux, c = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x, l_aux, c = block(x, cos, sin)
            if l_aux is not None:
                aux = aux + l_aux
                counts.append(c)
        self.expert_counts = counts
        return self.lm_head(self.norm(x)), aux

    def balance_experts(self, loads: torch.Tensor) -> None:
        """Loss-free balancing's update after an optimiser step, from that step's expert loads [n_moe_layers,
        n_expert] (token counts summed over micro-batches and ranks); nothing under aux-loss balancing."""
        if self.cfg.balancing != "loss_free":
            return
        gates = [b.ffn.moe.deepspeed_moe.gate for b in self.blocks if isinstance(b.ffn, MoEFFN)]
        for gate, load in zip(gates, loads, strict=True):
            gate.balance(load.to(gate.route_bias.device))

    # -- parameter counts (non-embedding: tok_emb and lm_head excluded, as the paper's N) --------------------

    def n_total(self) -> int:
        """All non-embedding parameters (every expert and router); tied embeddings are one tensor, counted once."""
        emb = {id(p): p.numel() for p in (self.tok_emb.weight, self.lm_head.weight)}
        return sum(p.numel() for p in self.parameters()) - sum(emb.values())

    def n2(self) -> int:
        """Active parameters per token: all but the (n_expert - topk) unselected experts of each MoE layer."""
        if not self.cfg.is_moe:
            return self.n_total()
        idle = (self.cfg.n_expert - self.cfg.topk) * 3 * self.cfg.d_model * self.cfg.d_expert
        return self.n_total() - self.cfg.n_layer * idle

    def n1(self) -> int:
        """Parameters of the dense model with this trunk (N1 of the paper)."""
        return sizes.dense_params(self.cfg.shape)

    def flops_per_token(self) -> int:
        """Training FLOPs per token at full context: 6·(N2 + LM head) + attention (sweeps.sizes)."""
        return sizes.train_flops_per_token(self.cfg.shape, self.n2(), self.cfg.context, self.cfg.vocab_size)


def init_router(cfg: ModelConfig, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Fresh router weights for one MoE layer, keyed by their name under `gate.wg`."""
    n, d = cfg.n_expert, cfg.d_model

    def draw(rows: int, cols: int) -> torch.Tensor:
        if cfg.router_init == "normal_2_5d":
            return torch.randn(rows, cols, generator=gen) * math.sqrt(2.0 / (5.0 * cols))
        if cfg.router_init == "normal_0.02":
            return torch.randn(rows, cols, generator=gen) * 0.02
        if cfg.router_init == "uniform_0.02":
            # Drop-Upcycling's torch_rand_002: (U[0,1) - sample mean) * 0.02 * sqrt(12)
            u = torch.rand(rows, cols, generator=gen)
            return (u - u.mean()) * 0.02 * math.sqrt(12.0)
        bound = 1.0 / math.sqrt(cols)  # nn.Linear's kaiming_uniform(a=sqrt(5)) bound
        return (torch.rand(rows, cols, generator=gen) * 2 - 1) * bound

    if cfg.router_type == "linear":
        return {"weight": draw(n, d)}
    if cfg.router_type == "mlp":
        return {"proj.weight": draw(n, d), "out.weight": draw(n, n)}
    # A random mixture router: queries like attention projections, keys at the router init scale.
    m = cfg.routers
    q = torch.randn(m, d // m, d, generator=gen) * cfg.init_std
    return {"queries": q, "keys": draw(n, d // m)}


def build_model(cfg: ModelConfig, seed: int, device: str | torch.device | None = None,
                ep_rank: int = 0) -> UpscaleLM:
    """A freshly initialised model: N(0, init_std) weights, Megatron's std/sqrt(2L) on the residual outputs
    (wo, w_down; the paper trains with Megatron), RMSNorm weights 1, routers per `cfg.router_init`; with
    `cfg.ep_size` > 1, expert-parallel rank `ep_rank`'s slice of them. `device="meta"` allocates nothing."""
    model = empty_model(cfg, device)
    if model.tok_emb.weight.device.type != "meta":
        _init_weights(model, seed, ep_rank)
    return model


def empty_model(cfg: ModelConfig, device: str | torch.device | None = None) -> UpscaleLM:
    """The model with uninitialised weights on `device` (CPU by default), for a caller that fills them next (a
    state dict, a checkpoint, `build_model`'s draws). Built on the meta device, so module constructors run no
    default init and DeepSpeed's per-expert deep copies copy nothing, then allocated once on `device`: no host
    memory for a CUDA device."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    with torch.device("meta"):
        model = UpscaleLM(cfg)
    if device.type == "meta":
        return model
    for p in model.parameters():  # each Parameter once (a tied embedding stays one), swapped in place
        attrs = dict(vars(p))  # DeepSpeed marks expert parameters (allreduce, group_name); swap_tensors swaps them
        torch.utils.swap_tensors(p, nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device),
                                                 p.requires_grad))
        vars(p).update(attrs)
    return model.to(device)  # the RoPE tables (computed on the CPU whatever the ambient device)


def _init_weights(model: UpscaleLM, seed: int, ep_rank: int = 0) -> None:
    """Draws `build_model`'s initial weights into `model` in place; an expert-parallel model (`cfg.ep_size` > 1) gets
    the draws of expert-parallel rank `ep_rank`'s experts, so that every rank holds its slice of the single-process
    model's init without building the rest. Each parameter is drawn on the CPU from its own generator, seeded by its
    index in the single-process model's parameter order, so the draws run on `torch.get_num_threads()` threads
    and give the same bits as one thread (and on any device)."""
    cfg = model.cfg
    if not 0 <= ep_rank < cfg.ep_size:
        raise WorkerError(f"ep_rank={ep_rank} is outside the expert-parallel group of ep_size={cfg.ep_size}")
    ids = _draw_ids(model, ep_rank)
    out_std = cfg.init_std / math.sqrt(2 * cfg.n_layer)

    @torch.no_grad()  # per thread: grad mode is thread-local
    def draw(name: str, p: torch.Tensor) -> None:
        std = out_std if name.endswith(("wo.weight", "w_down.weight")) else cfg.init_std
        gen = seeded_generator(seed, 0, ids[name])
        if p.device.type == "cpu":
            p.normal_(generator=gen).mul_(std)
        else:
            p.copy_(torch.empty(p.shape, dtype=p.dtype).normal_(generator=gen).mul_(std))

    drawn = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif ".gate.wg." not in name:
                drawn.append((name, p))
        drawn.sort(key=lambda item: -item[1].numel())  # largest first: the threads finish together
        with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
            list(pool.map(lambda item: draw(*item), drawn))
        for layer, block in enumerate(model.blocks):
            if isinstance(block.ffn, MoEFFN):
                fresh = init_router(cfg, seeded_generator(seed, 1, layer))
                for name, p in block.ffn.moe.deepspeed_moe.gate.wg.named_parameters():
                    p.copy_(fresh[name])


def _draw_ids(model: UpscaleLM, ep_rank: int) -> dict[str, int]:
    """Each parameter's index in the single-process model's parameter order (what seeds its draw); local expert j of
    expert-parallel rank r is global expert r·(n_expert/ep_size) + j."""
    cfg = model.cfg
    if cfg.ep_size == 1:
        return {name: i for i, (name, _) in enumerate(model.named_parameters())}
    ids = _draw_ids(empty_model(cfg.model_copy(update={"ep_size": 1}), "meta"), 0)
    local = cfg.n_expert // cfg.ep_size

    def global_name(name: str) -> str:
        m = EXPERT_KEY.match(name)
        return name if m is None else f"{m[1]}{ep_rank * local + int(m[2])}{m[3]}"

    return {name: ids[global_name(name)] for name, _ in model.named_parameters()}
