"""What one training job is: a frozen, hashed `SegmentSpec`; where and how it runs: `SegmentRuntime`, never hashed.

A sweep compiles into a DAG of segments (docs/architecture.md, "Segments and WSD reuse"). A segment's id is a short hash
of the canonical JSON of *every* identity field, parents' ids included, so two sweeps that need the same training job
share it and a checkpoint can never be silently reused for a different config (docs/conventions.md, "Content-addressed
segments"). Runtime-only fields (paths, tracking URIs, threads, logging cadence) live in `SegmentRuntime` and never
change an id.

Token bookkeeping is exact and absolute: every count is a multiple of `tokens_per_step = batch_size * context`, and a
segment covers [start_tokens, end_tokens) of one schedule whose decay starts at the absolute `decay_start_tokens`.
So a trunk (warmup + constant LR, checkpoints at every branch point) followed by a decay branch that resumes at a
branch point is the same computation as one uninterrupted WSD run to the branch's budget.

Kinds:
    dense_trunk   warmup + constant LR from random init; saves a checkpoint at every `save_at_tokens`
    dense_decay   resumes its trunk at start_tokens, decays to end_tokens = D1: one dense observation
    dense_import  a dense model trained elsewhere (`model.dense`), keyed by its weights' content and its D1
                  (start_tokens = end_tokens = D1): no training; its validation loss is one dense observation
    upcycle       builds the MoE from its parent's final dense weights (no training, no tokens)
    expand        grows a trained E-expert MoE (a scratch_decay's final weights) to m·E experts (`ExpandSpec`; no
                  training, no tokens)
    moe_trunk     trains the upcycled (or expanded) MoE: warmup + constant at the MoE LR; checkpoints at every D2
                  branch point
    moe_decay     decays it to D2: one upcycled (or expanded) observation (D1, D2, N1, config)
    scratch_trunk / scratch_decay   the same for an MoE from random init: observations of the MoE law
    lr_search     an Optuna study of short runs that fixes the peak LR of one (family, size)
"""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = 1
# What a segment computes, as a version: bump it by hand (2, 3, ...) in the change that alters the result of training
# a segment with the same spec: data order or tokenisation, init, the LR schedule, the loss, the model's math. Every
# planned segment's key then changes; what a store holds under the older version is stale (sweeps/reuse.py).
TRAINING_SEMANTICS = 1

SegmentKind = Literal[
    "dense_trunk", "dense_decay", "dense_import", "upcycle", "expand", "moe_trunk", "moe_decay", "scratch_trunk",
    "scratch_decay", "lr_search",
]
BUILD_KINDS = frozenset({"upcycle", "expand"})  # build a model from their parent's weights: no training, no tokens
TRUNK_KINDS = frozenset({"dense_trunk", "moe_trunk", "scratch_trunk"})
DECAY_KINDS = frozenset({"dense_decay", "moe_decay", "scratch_decay"})
DecayShape = Literal["linear", "cosine", "1-sqrt"]


class Frozen(BaseModel):
    """Base for identity models: immutable, no unknown keys, no infinite or NaN numbers (JSON's `Infinity`, YAML's
    `.inf`: no budget, rate or size is infinite, and an infinity reaching the planner's arithmetic overflows).

    Its fingerprint (`canonical_json`) holds every field but two kinds:
    - `optional_fields`, while at their default: options whose default computes what a model without the option
      computes, so adding such an option keeps the key of every spec that does not use it. A new optional field of an
      identity model belongs here.
    - `identity_omits()`: fields that cannot change the result of this instance (a dispatch strategy, an option its
      method never reads, a path whose content is fingerprinted)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    optional_fields: ClassVar[frozenset[str]] = frozenset()

    def identity_omits(self) -> frozenset[str]:
        return frozenset()


# The MoE options a sweep spec (sweeps/spec.py `MoeSection`) and a segment's `ModelSpec` share, each described once
# here; the workers' ModelConfig is a ModelSpec, so it shares them too.
Routing = Annotated[Literal["softmax_topk", "deepspeed"], Field(
    description="softmax_topk: softmax over all experts, top-k, renormalised over the chosen k (weight 1 for top-1, "
    "so naive top-1 upcycling preserves the dense function; the paper's Eq. 15, Mixtral's router); deepspeed: "
    "DeepSpeed's gate (top-1 weighted by its probability). The same computation for k >= 2 "
    "(docs/methods.md, \"Routing\").")]
Dispatch = Annotated[Literal["grouped", "deepspeed"], Field(
    description="How tokens reach the experts: grouped (dropless, sorted; workers/dispatch.py) or DeepSpeed's "
    "capacity buffer (slower). Equal results (fp32 <= 1e-5): not part of the identity "
    "(docs/methods.md, \"Dispatch\").")]
AuxLossCoef = Annotated[float, Field(ge=0, description="Load-balancing loss coefficient (the paper: 1e-3).")]
Balancing = Annotated[Literal["aux_loss", "loss_free"], Field(
    description="How expert load is balanced: aux_loss adds aux_loss_coef times DeepSpeed's load-balancing loss; "
    "loss_free (DeepSeek-V3) adds a per-expert bias to the routing scores for the top-k choice only and nudges it "
    "by balancing_rate toward equal load after every step, with no loss term (docs/methods.md, \"Loss-free "
    "balancing\").")]
BalancingRate = Annotated[float, Field(gt=0, le=1, description="loss_free: the bias update per step, u in "
                                       "b_i += u·sign(mean load - load_i) (DeepSeek-V3: 1e-3).")]
RouterInit = Annotated[Literal["normal_2_5d", "normal_0.02", "uniform_0.02", "kaiming_uniform"], Field(
    description="Router init: N(0, 2/(5·d_model)) (the paper's A.6), N(0, 0.02^2), zero-mean uniform with std 0.02 "
    "(Drop-Upcycling's torch_rand_002), or torch's kaiming-uniform (DeepSpeed's untouched default).")]
MIN_EXPERTS = 2  # an MoE layer has at least two experts; n_expert = 0 is the dense FFN, and 1 is neither
FFN_MULT = 4  # the dense FFN is FFN_MULT·d_model wide, as the paper's 4·d_model
# Bounds far above any real model or run (the largest public ones train ~1e13 tokens, ~100 layers, d_model ~16k,
# a few hundred experts) that keep every count derived from them inside the store's 64-bit integers: tokens x
# lr_search trials, and an MoE's parameters (MAX_LAYERS x 12 x MAX_EXPERTS x MAX_WIDTH^2 ~ 2e17 < 2^63).
MAX_TOKENS = 10**14
MAX_LAYERS = 1024
MAX_WIDTH = 65536
MAX_EXPERTS = 4096
MAX_TRIALS = 10000
# Bounds on what a data section makes a worker hold or compute: a context of 2**17 tokens (the longest trained
# contexts), a vocabulary of 2**22 (the largest public tokenizers have ~2.6e5), and at most 2**30 held-out tokens per
# evaluation (an hour of a GPU's forward passes on a large model).
MAX_CONTEXT = 1 << 17
MAX_VOCAB = 1 << 22
MAX_EVAL_TOKENS = 1 << 30
# A `**` in a corpus glob walks every folder below its base once per `**` before it; two of them cost the square of
# the tree, ten its tenth power. One is all a corpus needs (`/data/**/*.parquet`).
MAX_GLOB_RECURSIONS = 1


class Shape(Frozen):
    """A decoder's shape: layers, width, heads, and optionally the FFN width and grouped-query K/V heads. The one
    description of it that the spec, segments and the workers' model build on, so its rules are checked here only."""

    n_layer: int = Field(ge=1, le=MAX_LAYERS, description="Transformer blocks.")
    d_model: int = Field(ge=1, le=MAX_WIDTH, description="Residual width.")
    n_head: int = Field(ge=1, le=MAX_WIDTH, description="Attention heads; must divide d_model.")
    ffn_width: int | None = Field(
        None, ge=1, le=4 * MAX_WIDTH, description="The FFN's intermediate width; None = 4·d_model (the paper's).")
    n_kv_head: int | None = Field(
        None, ge=1, le=MAX_WIDTH, description="Key/value heads of grouped-query attention; None = n_head (full "
        "multi-head attention). Must divide n_head.")

    @model_validator(mode="before")
    @classmethod
    def _canonical_defaults(cls, data: object) -> object:
        """An FFN width of 4·d_model or n_kv_head = n_head is the default spelled out: store None, so the same model
        has one identity however it was written."""
        if isinstance(data, dict):
            d_model = data.get("d_model")
            if isinstance(d_model, int) and data.get("ffn_width") == FFN_MULT * d_model:
                data = {**data, "ffn_width": None}
            if data.get("n_kv_head") is not None and data.get("n_kv_head") == data.get("n_head"):
                data = {**data, "n_kv_head": None}
        return data

    @model_validator(mode="after")
    def _check_heads(self) -> Shape:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.n_kv_head is not None and self.n_head % self.n_kv_head:
            raise ValueError(f"n_kv_head={self.n_kv_head} does not divide n_head={self.n_head}; valid: a divisor "
                             f"of {self.n_head}")
        return self

    @property
    def d_ff(self) -> int:
        return self.ffn_width if self.ffn_width is not None else FFN_MULT * self.d_model

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def d_kv(self) -> int:
        """Width of the K and V projections: kv_heads · d_model / n_head (d_model without GQA)."""
        return self.kv_heads * (self.d_model // self.n_head)

    @property
    def shape(self) -> Shape:
        """The bare shape of this model (a subclass's extra fields dropped)."""
        return Shape(n_layer=self.n_layer, d_model=self.d_model, n_head=self.n_head, ffn_width=self.ffn_width,
                     n_kv_head=self.n_kv_head)

    optional_fields: ClassVar[frozenset[str]] = frozenset({"ffn_width", "n_kv_head"})


class ModelSpec(Shape):
    """The architecture: a Llama-style decoder whose FFN is dense (n_expert = 0) or a top-k MoE (n_expert >= 2).

    The one model schema: a segment hashes it, and the workers' `ModelConfig` (workers/model.py) is a ModelSpec
    plus what an upcycling method reshapes and where the model runs."""

    vocab_size: int = Field(ge=2, le=MAX_VOCAB, description="Tokeniser vocabulary size (256 for bytes).")
    context: int = Field(ge=1, le=MAX_CONTEXT, description="Tokens per training sequence (the RoPE table's length).")
    n_expert: int = Field(0, ge=0, le=MAX_EXPERTS, description=f"Experts per MoE layer: 0 = dense FFN, else >= "
                          f"{MIN_EXPERTS}.")
    topk: int = Field(0, ge=0, description="Experts each token is routed to (token choice), 1..n_expert; 0 for dense.")
    aux_loss_coef: AuxLossCoef = 1e-3
    router_init: RouterInit = "normal_2_5d"
    init_std: float = Field(0.02, gt=0, description="Std of the normal init of the other weights.")
    routing: Routing = "softmax_topk"
    dispatch: Dispatch = "grouped"
    balancing: Balancing = "aux_loss"
    balancing_rate: BalancingRate = 1e-3
    tie_embeddings: bool = Field(False, description="The LM head shares the input embedding's weights.")
    norm_eps: float = Field(1e-5, gt=0, le=1, description="RMSNorm epsilon.")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base.")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if 0 < self.n_expert < MIN_EXPERTS:
            raise ValueError(f"n_expert={self.n_expert}: an MoE has at least {MIN_EXPERTS} experts; use n_expert=0 "
                             "for a dense model")
        if self.n_expert == 0 and self.topk != 0:
            raise ValueError(f"topk={self.topk} given for a dense model (n_expert=0); use topk=0")
        if self.n_expert > 0 and not 1 <= self.topk <= self.n_expert:
            raise ValueError(f"topk={self.topk} is not valid for n_expert={self.n_expert}; valid: 1..{self.n_expert}")
        if self.balancing == "loss_free" and not self.is_moe:
            raise ValueError("balancing='loss_free' given for a dense model (n_expert=0): it balances experts")
        if self.balancing == "loss_free" and self.topk == 1 and self.routing == "softmax_topk":
            raise ValueError("balancing='loss_free' with topk=1 and routing='softmax_topk' leaves the router without "
                             "gradient (its one weight is the constant 1 and no aux loss is added); use "
                             "routing='deepspeed' or topk >= 2")
        return self

    @property
    def is_moe(self) -> bool:
        return self.n_expert >= MIN_EXPERTS

    @property
    def aux_loss_weight(self) -> float:
        """The coefficient the trainer puts on the load-balancing loss: none under loss-free balancing."""
        return 0.0 if self.balancing == "loss_free" else self.aux_loss_coef

    optional_fields: ClassVar[frozenset[str]] = Shape.optional_fields | {
        "tie_embeddings", "norm_eps", "rope_theta", "balancing", "balancing_rate"}

    def identity_omits(self) -> frozenset[str]:
        """`dispatch` never changes the result. `routing` is hashed only where it departs from DeepSpeed's gate:
        softmax_topk at top-1 (at k >= 2 both are the same renormalised top-k; a dense model has no router).
        `balancing_rate` only under loss-free balancing, `aux_loss_coef` only without it."""
        omit = {"dispatch"}
        if not (self.topk == 1 and self.routing == "softmax_topk"):
            omit.add("routing")
        omit.add("aux_loss_coef" if self.balancing == "loss_free" else "balancing_rate")
        return frozenset(omit)


BUILTIN_STDLIB = "builtin:python-stdlib"  # the running Python's standard library, read by workers/data.py
BUILTIN_CORPORA = frozenset({BUILTIN_STDLIB})


class DataSpec(Frozen):
    """Where tokens come from: a corpus, a tokeniser, and the held-out set the validation loss is measured on.

    Local files only (README, "Data and tokenizers"); sweeps/data_sources.py reads their layout and vocabulary."""

    corpus: str = Field("builtin:python-stdlib", description="builtin:python-stdlib, a folder of text files (one "
                        "document per file), a Hugging Face dataset saved with save_to_disk, or .parquet/.jsonl/"
                        ".json/.txt/.csv files: a path or a glob, read with datasets.load_dataset.")
    text_column: str = Field("text", validation_alias=AliasChoices("text_column", "text_field"),
                             description="Column holding the text in dataset corpora (`text_field` is an alias).")
    tokenizer: str = Field("bytes", min_length=1, description="bytes (UTF-8 bytes), bpe (a BPE trained on the "
                           "corpus), or the path of a Hugging Face tokenizer folder or tokenizer.json file.")
    bpe_vocab_size: int = Field(4096, ge=257, le=MAX_VOCAB, description="Vocabulary size of the BPE tokeniser.")
    eval_tokens: int = Field(65536, ge=1, le=MAX_EVAL_TOKENS,
                             description="Held-out validation tokens (split by document).")
    data_seed: int = Field(0, description="Seed of the train/validation split and of batch order.")
    fingerprint: str | None = Field(None, description="Content hash of a user corpus's and a Hugging Face "
                                    "tokenizer's files; set by the planner, leave unset.")

    optional_fields: ClassVar[frozenset[str]] = frozenset({"fingerprint"})

    @field_validator("corpus")
    @classmethod
    def _one_recursion(cls, corpus: str) -> str:
        """Refused before anything walks the glob: its cost is what the `**` count multiplies."""
        if corpus.count("**") > MAX_GLOB_RECURSIONS:
            raise ValueError(f"a corpus glob may hold at most {MAX_GLOB_RECURSIONS} `**` (this one has "
                             f"{corpus.count('**')}): each `**` walks the whole tree below the ones before it; "
                             "write one, e.g. /data/**/*.parquet")
        return corpus

    def identity_omits(self) -> frozenset[str]:
        """With a fingerprint, the files' content stands for their paths: the same files anywhere give the same key,
        changed files a new one."""
        if self.fingerprint is None:
            return frozenset()
        omit = set()
        if self.corpus not in BUILTIN_CORPORA:
            omit.add("corpus")
        if self.tokenizer not in ("bytes", "bpe"):
            omit.add("tokenizer")
        return frozenset(omit)


class OptimSpec(Frozen):
    """AdamW and the batch, as the paper's Table 4 by default."""

    lr: float | None = Field(description="Peak learning rate; None = taken from the parent lr_search segment.")
    batch_size: int = Field(ge=1, description="Sequences per optimiser step.")
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = Field(1.0, ge=0, description="Global gradient-norm clip; 0 disables.")


class ScheduleSpec(Frozen):
    """The LR schedule shared by a trunk and all its branches; absolute step boundaries come from the segment."""

    kind: Literal["wsd", "cosine"] = Field("wsd", description="Warmup-stable-decay, or a cosine baseline.")
    warmup_tokens: int = Field(ge=0, description="Linear warmup from 0 to the peak LR.")
    decay_fraction: float = Field(0.1, gt=0, le=1, description="Fraction of a budget D spent decaying (WSD).")
    decay_shape: DecayShape = Field("linear", description="Shape of the decay: linear, cosine or 1-sqrt.")
    final_lr_fraction: float = Field(0.1, ge=0, le=1, description="LR at the end of the decay, as a fraction "
                                     "of the peak.")


Method = Literal["naive", "drop", "noise", "llama-moe", "router-upcycling", "granular", "scratch"]
Split = Literal["independent-random", "independent-clustering", "sharing-inner", "sharing-inter"]


class UpcycleSpec(Frozen):
    """How a dense model becomes an MoE (docs/methods.md): one method and its options, the papers' defaults.

    Fields a method does not use are ignored by it (and still recorded in lineage).
    """

    method: Method = Field(description="construction method (docs/methods.md)")
    seed: int = Field(default=0, description="seed of the method's random draws (fresh router, re-initialised neurons)")
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
    llama_gate_init: Literal["official", "model"] = Field(
        default="official", description="llama-moe: gate init; official = N(0, 0.02^2) on every gate layer "
        "(pjlab-sys4nlp/llama-moe), model = the model's router_init",
    )
    score_scale: float | None = Field(
        default=None, gt=0.0, description="llama-moe: expert output scale folded into W_down; None = n_expert/topk"
    )
    n_residual: int = Field(default=1, ge=1, description="llama-moe sharing-inter: always-on residual experts")
    granularity: int = Field(default=2, ge=1, description="granular: G = dense d_ff / expert d_ff")
    n_routers: int = Field(default=0, ge=0, description="router-upcycling: routers m; 0 = n_expert (paper's best)")

    def identity_omits(self) -> frozenset[str]:
        """`llama_gate_init` is read by llama-moe only."""
        return frozenset() if self.method == "llama-moe" else frozenset({"llama_gate_init"})


class ExpandSpec(Frozen):
    """How a trained E-expert MoE becomes an m·E-expert one with the same top-k (expert upcycling; docs/methods.md,
    "Expansion"): every expert duplicated, the router's rows copied."""

    factor: int = Field(ge=2, le=MAX_EXPERTS, description="m: the expanded model has m·E experts (E the parent's).")
    strategy: Literal["uniform", "utility"] = Field(
        default="uniform", description="uniform: m copies of every expert; utility: one copy each, the other "
        "(m-1)·E shared in proportion to the expert's mean routing score on calibration tokens")
    bias_noise: float = Field(
        default=0.01, ge=0.0, description="std of the noise on a replica's loss-free routing bias, as a fraction of "
        "the std of the parent layer's bias (the expert-upcycling code's bias_only router, scale 0.01); 0 = exact "
        "copies. Without loss-free balancing there is no bias and nothing is perturbed")
    r: float = Field(default=0.0, ge=0.0, le=1.0, description="Drop-Upcycling on the replicas: fraction of their "
                     "neurons re-initialised (the first copy of each expert is kept whole); 0 = plain copies")
    index_mode: Literal["shared", "per_matrix"] = Field(
        default="shared", description="with r > 0: Drop-Upcycling's index sets (UpcycleSpec.index_mode)")
    seed: int = Field(default=0, description="seed of the bias noise and the re-initialised neurons")

    @property
    def method(self) -> str:
        """The method an expanded observation records: expand-uniform or expand-utility."""
        return f"expand-{self.strategy}"


class LrSearchSpec(Frozen):
    """An Optuna study of short runs over the peak LR of one family and size."""

    trials: int = Field(ge=1, le=MAX_TRIALS, description="Optuna trials.")
    low: float = Field(gt=0, description="Lowest peak LR tried (log-uniform).")
    high: float = Field(gt=0, description="Highest peak LR tried (log-uniform).")
    tokens: int = Field(ge=1, le=MAX_TOKENS, description="Tokens per trial.")


class DenseImportSpec(Frozen):
    """A dense model directory a sweep starts from. Its identity is the content of its weights, not where they are:
    the same weights copied elsewhere are the same segment, changed weights a new one."""

    path: str = Field(description="The upscale model directory (config.json + weights.pt); not part of the id.")
    fingerprint: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of its weights file.")

    def identity_omits(self) -> frozenset[str]:
        return frozenset({"path"})


class SegmentSpec(Frozen):
    """One training job, identified by the hash of everything that determines its output."""

    kind: SegmentKind
    model: ModelSpec = Field(description="The architecture trained (the MoE's, for upcycle, expand and MoE kinds).")
    data: DataSpec
    optim: OptimSpec | None = Field(None, description="None only for upcycle, expand and dense_import.")
    schedule: ScheduleSpec | None = Field(None, description="None only for upcycle, expand and dense_import.")
    upcycle: UpcycleSpec | None = Field(None, description="Set for upcycle segments only.")
    expand: ExpandSpec | None = Field(None, description="Set for expand segments only.")
    lr_search: LrSearchSpec | None = Field(None, description="Set for lr_search segments only.")
    dense_import: DenseImportSpec | None = Field(None, description="Set for dense_import segments only.")
    seed: int = Field(0, description="Seed of model init and training randomness.")
    start_tokens: int = Field(0, ge=0, description="Tokens already trained when the segment starts.")
    end_tokens: int = Field(0, ge=0, description="Tokens trained when it ends (a decay branch: the budget D).")
    decay_start_tokens: int | None = Field(None, description="Absolute token count where the LR decay starts; "
                                           "None for trunks, which never decay.")
    save_at_tokens: tuple[int, ...] = Field((), description="Trunks: points before the end where a checkpoint is kept "
                                            "(the planner's trunk pieces keep only their end).")
    parent_ids: tuple[str, ...] = Field((), description="Ids of the segments whose outputs this one starts from.")
    semantics: int = Field(default_factory=lambda: TRAINING_SEMANTICS, ge=1,
                           description="The training-semantics version the segment is trained under (default: the "
                           "running code's, TRAINING_SEMANTICS); hashed from version 2 on (sweeps/reuse.py).")

    @model_validator(mode="after")
    def _check(self) -> SegmentSpec:
        needs_training = self.kind not in BUILD_KINDS | {"dense_import"}
        if needs_training != (self.optim is not None and self.schedule is not None):
            raise ValueError(f"{self.kind}: optim and schedule must be set exactly when the segment trains")
        for kind in ("upcycle", "expand", "lr_search", "dense_import"):
            if (self.kind == kind) != (getattr(self, kind) is not None):
                raise ValueError(f"{self.kind}: `{kind}` is set exactly for {kind} segments")
        if self.kind == "expand" and not self.model.is_moe:
            raise ValueError(f"expand: the expanded model is an MoE; got n_expert={self.model.n_expert}")
        if self.kind == "dense_import" and (self.model.is_moe or not 0 < self.start_tokens == self.end_tokens):
            raise ValueError("dense_import: a dense model whose trained tokens D1 > 0 are both start_tokens and "
                             f"end_tokens (got n_expert={self.model.n_expert}, {self.start_tokens}, {self.end_tokens})")
        if self.kind in TRUNK_KINDS | DECAY_KINDS:
            step = self.tokens_per_step
            for name in ("start_tokens", "end_tokens"):
                if getattr(self, name) % step:
                    raise ValueError(f"{name}={getattr(self, name)} is not a multiple of batch_size·context={step}")
            if self.end_tokens <= self.start_tokens:
                raise ValueError(f"end_tokens={self.end_tokens} must exceed start_tokens={self.start_tokens}")
            if list(self.save_at_tokens) != sorted(set(self.save_at_tokens)):
                raise ValueError(f"save_at_tokens must be strictly increasing, got {self.save_at_tokens}")
            if any(t % step or not self.start_tokens < t <= self.end_tokens for t in self.save_at_tokens):
                raise ValueError(f"save_at_tokens {self.save_at_tokens} must be multiples of {step} within "
                                 f"({self.start_tokens}, {self.end_tokens}]")
        if self.kind in DECAY_KINDS:
            d = self.decay_start_tokens
            if d is None or d % self.tokens_per_step or not self.start_tokens <= d < self.end_tokens:
                raise ValueError(f"{self.kind}: decay_start_tokens={d} must be a step multiple in "
                                 f"[{self.start_tokens}, {self.end_tokens})")
        if self.kind in TRUNK_KINDS and self.decay_start_tokens is not None:
            raise ValueError(f"{self.kind}: trunks never decay; decay_start_tokens must be None")
        if self.kind in TRUNK_KINDS and self.start_tokens > 0 and not self.parent_ids:
            raise ValueError(f"{self.kind}: a trunk piece starting at {self.start_tokens} tokens continues the piece "
                             "before it; parent_ids must name it")
        return self

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one optimiser step (batch_size · context); 0 for the kinds that do not train."""
        return self.optim.batch_size * self.model.context if self.optim else 0

    @property
    def id(self) -> str:
        """Content key: 16 hex digits of the SHA-256 of the canonical JSON of every field."""
        return fingerprint(self)

    optional_fields: ClassVar[frozenset[str]] = frozenset({"dense_import", "expand"})

    def identity_omits(self) -> frozenset[str]:
        """Training-semantics version 1 is left out: a version-1 key is the job's unversioned key (sweeps/reuse.py)."""
        return frozenset({"semantics"}) if self.semantics == 1 else frozenset()


def canonical_json(value: Any, memo: dict[int, tuple[Any, Any]] | None = None) -> str:
    """Deterministic JSON of a spec: sorted keys, sets sorted, enums as values; callables and bare objects refused.

    A spec read from YAML and the equal one built in Python give the same string. `memo` lets a
    caller hashing many specs that share frozen sub-models (the planner) convert each sub-model once.
    """
    return json.dumps(_plain(value, memo), sort_keys=True, separators=(",", ":"), allow_nan=False)


def fingerprint(value: Any, memo: dict[int, tuple[Any, Any]] | None = None) -> str:
    return hashlib.sha256(canonical_json(value, memo).encode()).hexdigest()[:16]


def _plain_fields(value: BaseModel, memo: dict[int, tuple[Any, Any]] | None) -> dict[str, Any]:
    """The fields of ``value`` that are part of its identity (`Frozen`'s two rules), as plain data."""
    fields = type(value).model_fields
    omit: set[str] = set()
    if isinstance(value, Frozen):
        omit.update(value.identity_omits())
        omit.update(k for k in value.optional_fields if getattr(value, k) == fields[k].get_default())
    return {k: _plain(getattr(value, k), memo) for k in fields if k not in omit}


def _plain(value: Any, memo: dict[int, tuple[Any, Any]] | None = None) -> Any:
    if isinstance(value, BaseModel):
        if memo is not None and isinstance(value, Frozen):  # immutable: convert once; memo keeps it alive (id reuse)
            hit = memo.get(id(value))
            if hit is None:
                hit = memo[id(value)] = (value, _plain_fields(value, memo))
            return hit[1]
        return _plain_fields(value, memo)
    if isinstance(value, Enum):
        return _plain(value.value, memo)
    if isinstance(value, dict):
        return {str(k): _plain(v, memo) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, memo) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v, memo) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value  # 2.0e5 from YAML hashes as 200000
    raise TypeError(f"cannot fingerprint a {type(value).__name__}: only data (models, numbers, strings, "
                    "lists, dicts, sets, enums) may be part of a segment's identity")


class SegmentRuntime(BaseModel):
    """Placement and bookkeeping of one attempt at a segment; never part of its id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint_dir: str = Field(description="Where this segment writes its checkpoints (a path or fsspec URI).")
    parent_checkpoints: dict[str, str] = Field(
        default_factory=dict,
        description="Parent segment id -> checkpoint directory to start from (a trunk's, at this start_tokens).",
    )
    mlflow_tracking_uri: str | None = Field(None, description="None = do not log to MLflow.")
    mlflow_run_id: str | None = Field(None, description="An existing run to log into (created by the orchestrator).")
    mlflow_tags: dict[str, str] = Field(default_factory=dict, description="MLflow tags added to the run the worker "
                                        "creates when it has no mlflow_run_id (a segment trained alone).")
    num_threads: int = Field(1, ge=1, description="torch.set_num_threads inside the job (Ray does not set it).")
    device: str = Field("cpu", description="cpu or cuda; bf16 autocast on CUDA, fp32 on CPU.")
    workers: int = Field(1, ge=1, description="Data/expert-parallel processes (Ray Train when > 1).")
    eval_every_tokens: int | None = Field(None, description="Periodic validation; None = at the segment's start "
                                          "and end only.")
    checkpoint_every_tokens: int | None = Field(None, description="Periodic resume checkpoints; None = none.")
    log_every_steps: int = Field(10, ge=1, description="Training metrics cadence.")
    zero_stage: int = Field(0, ge=0, le=2, description="DeepSpeed ZeRO stage (0-2; MoE does not support 3).")
    micro_batch_size: int | None = Field(None, ge=1, description="Sequences per forward pass on each worker, "
                                         "gradients accumulated over a step's; None = the largest that fits the "
                                         "device's memory (docs/training.md).")
    activation_checkpointing: bool = Field(False, description="Recompute each block's activations in the backward "
                                           "pass instead of keeping them: less memory, ~1/3 more compute.")
    data_cache_dir: str | None = Field(None, description="Token cache folder; None = <UPSCALE_HOME>/data.")
    data_roots: tuple[str, ...] | None = Field(None, description="A server's UPSCALE_DATA_ROOTS: the worker refuses "
                                               "a corpus or tokenizer file outside them; None = not confined (the "
                                               "operator's own CLI).")


class SegmentResult(BaseModel):
    """What a finished segment reports back (the orchestrator stores it; observations are built from it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    segment_id: str
    kind: SegmentKind
    val_loss: float | None = Field(description="Validation loss at the end (None for upcycle, expand and "
                                   "lr_search).")
    tokens: int = Field(description="Tokens trained in this segment (end_tokens - start_tokens).")
    wall_s: float
    tokens_per_s: float
    checkpoint: str | None = Field(description="The final checkpoint directory.")
    branch_checkpoints: dict[int, str] = Field(default_factory=dict,
                                               description="Trunks: branch point tokens -> checkpoint directory.")
    best_lr: float | None = Field(None, description="lr_search: the chosen peak LR.")
    metrics: dict[str, float] = Field(default_factory=dict, description="Summary metrics (aux loss, load, ...).")
    curve: list[tuple[int, float]] = Field(
        default_factory=list, description="Every validation the segment ran, (tokens, loss) ascending: tokens on the "
        "sweep's absolute token axis (start_tokens to end_tokens), from the start one to the final one; a resumed "
        "segment keeps the points its checkpoint carried.")
