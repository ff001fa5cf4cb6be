"""Model shapes and exact parameter / FLOP counts, pure arithmetic (no torch).

Shared by the planner (cost of a grid) and by `workers.model` (which checks its real parameter
count against these formulas in tests). Named sizes are the upcycling-scaling-laws paper's Table 3
plus tiny shapes that train on a CPU.

Exact non-embedding counts for the Llama-style model (no biases, SwiGLU with d_ff = 4·d, RMSNorm
weights counted, router counted in the MoE), which reproduce Table 3 to the parameter:

    N1      = L·(16·d² + 2·d) + d                        (dense; Eq. 4 is the 16·L·d² leading term)
    N_total = L·(4·d² + 12·E·d² + 2·d + E·d) + d         (E experts; Eq. 6)
    N2      = L·(4·d² + 12·k·d² + 2·d + E·d) + d         (active with top-k; Eq. 5; the router runs for every token)

Imported shapes generalise two terms exactly: attention is 2·d² + 2·d·d_kv (grouped-query K/V projections of width
d_kv = n_kv_head·d/n_head) and the FFN 3·d·f for its width f (`Shape.ffn_width`). Tied embeddings change no count:
the embeddings are outside N, and the LM head's FLOPs are spent either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from upscale.sweeps.segments import Shape, UpcycleSpec

BYTES_PER_PARAM = 16  # fp32 weights and gradients (4 + 4) and AdamW's two moments (8)
BYTES_PER_ACTIVATION = 4  # fp32
# Of a device's memory, what the estimate may fill: the rest is for what it does not count (a CUDA context,
# allocator fragmentation, the temporaries of one operation).
MEMORY_HEADROOM = 0.8

# The paper's Table 3 (n_layer, d_model, n_head), then CPU-sized shapes for tests and the demo.
NAMED_SIZES: dict[str, Shape] = {
    "nano": Shape(n_layer=2, d_model=32, n_head=2),
    "micro": Shape(n_layer=2, d_model=64, n_head=4),
    "tiny": Shape(n_layer=4, d_model=128, n_head=4),
    "15M": Shape(n_layer=9, d_model=320, n_head=4),
    "44M": Shape(n_layer=12, d_model=480, n_head=8),
    "0.1B": Shape(n_layer=15, d_model=640, n_head=8),
    "0.2B": Shape(n_layer=21, d_model=832, n_head=8),
    "0.5B": Shape(n_layer=26, d_model=1120, n_head=16),
    "1B": Shape(n_layer=30, d_model=1504, n_head=16),
}


def shape_of(size: str) -> Shape:
    """The shape of a named size; a clear error listing the valid names otherwise."""
    try:
        return NAMED_SIZES[size]
    except KeyError:
        raise ValueError(f"unknown model size {size!r}; valid sizes: {', '.join(NAMED_SIZES)}") from None


def expert_widths(up: UpcycleSpec, d_ff: int, n_expert: int, topk: int) -> tuple[int, int]:
    """(expert d_ff, shared-expert d_ff) of the MoE that ``up`` builds from a dense FFN of width ``d_ff``; a
    ValueError saying what to change when the method cannot build it.

    Copying methods keep full-width experts; granular and LLaMA-MoE split the dense FFN. The one statement of these
    rules: the spec checks a grid with it at submit time (not after its dense training), the planner costs the
    narrower experts, and the upcycling methods build them.
    """
    if up.method == "granular":
        g = up.granularity
        if d_ff % g:
            raise ValueError(f"granularity={g} does not divide d_ff={d_ff}; valid: a divisor of {d_ff}")
        if n_expert % g:
            raise ValueError(f"granularity={g} does not divide n_expert={n_expert}; valid: a divisor of {n_expert}")
        if topk % g:
            raise ValueError(f"topk={topk} is not a multiple of granularity={g}: a token must select whole groups")
        return d_ff // g, 0
    if up.method == "llama-moe":
        sharing = up.split == "sharing-inter"
        parts = n_expert + up.n_residual if sharing else n_expert
        if d_ff % parts:
            what = f"n_expert + n_residual = {n_expert} + {up.n_residual} = {parts}" if sharing else \
                f"n_expert={n_expert}"
            raise ValueError(f"llama-moe {up.split} splits d_ff={d_ff} into {what} equal parts, which does not "
                             f"divide {d_ff}; choose a count that divides {d_ff}")
        return d_ff // parts, (up.n_residual * (d_ff // parts) if sharing else 0)
    return d_ff, 0


def _layer_common(s: Shape) -> int:
    # attention (q and o: d x d; k and v: d_kv x d, d_kv = d without GQA) + two RMSNorm weight vectors
    return 2 * s.d_model**2 + 2 * s.d_model * s.d_kv + 2 * s.d_model


def _ffn(s: Shape) -> int:
    return 3 * s.d_model * s.d_ff  # gate, up, down


def dense_params(s: Shape) -> int:
    """N1: non-embedding parameters of the dense model (final norm included)."""
    return s.n_layer * (_layer_common(s) + _ffn(s)) + s.d_model


def moe_total_params(s: Shape, n_expert: int, expert_d_ff: int | None = None, shared_d_ff: int = 0) -> int:
    """N_total: non-embedding parameters of the MoE with every expert and the routers.

    `expert_d_ff` (default d_ff) and an always-on `shared_d_ff` expert describe methods that split the dense FFN
    (granular, LLaMA-MoE) instead of copying it.
    """
    w = s.d_ff if expert_d_ff is None else expert_d_ff
    ffn = 3 * s.d_model * (n_expert * w + shared_d_ff)
    return s.n_layer * (_layer_common(s) + ffn + n_expert * s.d_model) + s.d_model


def moe_active_params(s: Shape, n_expert: int, topk: int, expert_d_ff: int | None = None, shared_d_ff: int = 0) -> int:
    """N2: parameters a token passes through (top-k experts, any shared expert, plus the router)."""
    w = s.d_ff if expert_d_ff is None else expert_d_ff
    ffn = 3 * s.d_model * (topk * w + shared_d_ff)
    return s.n_layer * (_layer_common(s) + ffn + n_expert * s.d_model) + s.d_model


def train_flops_per_token(s: Shape, active_params: int, context: int, vocab_size: int) -> int:
    """Training FLOPs per token: 6·(N_active + LM head) + attention scores/values (12·L·d·T, no causal halving)."""
    return 6 * (active_params + s.d_model * vocab_size) + 12 * s.n_layer * s.d_model * context


@dataclass(frozen=True)
class TrainingMemory:
    """What one worker holds to train a model (bytes): see `training_memory`."""

    params: int
    sequences: int
    state: int
    activations: int

    @property
    def total(self) -> int:
        return self.state + self.activations


def training_memory(s: Shape, n_expert: int, topk: int, expert_d_ff: int, shared_d_ff: int, *, vocab: int,
                    context: int, sequences: int, workers: int, checkpointing: bool = False) -> TrainingMemory:
    """A lower estimate of one worker's memory to train a model (dense when ``n_expert`` is 0) on ``sequences``
    sequences of ``context`` tokens per forward pass (a micro-batch; docs/training.md): BYTES_PER_PARAM for each
    parameter it holds (embeddings and LM head included; the experts split over gcd(workers, n_expert) ranks, as
    expert parallelism does), and fp32 activations kept for the backward pass: per token and layer the block's
    inputs, Q/K/V and attention output (8·d + 2·d_kv) and each active FFN's gate, up and product (3·f) with the
    router's logits, and the logits over the vocabulary twice (values and their softmax's gradient). Attention
    scores are not counted: scaled_dot_product_attention does not keep them. With ``checkpointing`` (activation
    checkpointing per block) a layer keeps only its input (d per token) and one block's activations exist at a time,
    while the backward pass recomputes it."""
    ffn = shared_d_ff + (topk * expert_d_ff if n_expert else s.d_ff)
    experts = s.n_layer * n_expert * 3 * s.d_model * expert_d_ff if n_expert else 0
    ep = math.gcd(workers, n_expert) if n_expert else 1
    total = moe_total_params(s, n_expert, expert_d_ff, shared_d_ff) if n_expert else dense_params(s)
    params = total - experts + experts // ep + 2 * vocab * s.d_model
    per_layer = 8 * s.d_model + 2 * s.d_kv + 3 * ffn + n_expert
    kept = s.n_layer * s.d_model + per_layer if checkpointing else s.n_layer * per_layer
    tokens = sequences * context
    return TrainingMemory(params, sequences, BYTES_PER_PARAM * params,
                          BYTES_PER_ACTIVATION * tokens * (kept + 2 * vocab))


def largest_micro_batch(rows: int, budget: float, need: Callable[[int], TrainingMemory]) -> int | None:
    """The largest micro-batch dividing a worker's ``rows`` sequences per step whose ``need(micro)`` fits in
    ``budget`` bytes; None when not even one sequence fits (the weights and optimiser state alone may not)."""
    divisors = sorted({d for m in range(1, math.isqrt(rows) + 1) if rows % m == 0 for d in (m, rows // m)},
                      reverse=True)
    return next((m for m in divisors if need(m).total <= budget), None)
