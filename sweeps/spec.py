"""The sweep spec's schema: what a user writes (YAML or JSON), parsed once into frozen pydantic models and checked
whole.

A spec is a grid over (N1, D1, D2, n_expert, topK, method, r) plus the training recipe. Validation happens here, at
the edge (docs/conventions.md), and reports *every* problem at once as `(field path, message)` pairs in one `SpecError`:
field-level problems come from pydantic, section-level ones from each section's validator, and cross-section ones
(budgets vs warmup and batch, checked by sweeps/steps.py's `resolve`) from `SweepSpec`'s validator, which runs once the
sections themselves are valid. Beside it: the memory a worker needs (sweeps/memory.py), what a cluster offers
(sweeps/resources.py) and the bounded reading of a document (sweeps/loader.py).

A spec may come from anyone who can reach the API, so checking one is bounded: every axis list holds at most MAX_AXIS
entries; a message quotes at most an `excerpt` of a bad value and a SpecError keeps at most MAX_PROBLEMS problems, so
an error is always small. A server passes its segment limit as `parse_spec(data, max_segments=...)`: a grid whose
`segment_bound` is larger is refused before the heavier cross-section checks and before any planning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

from upscale.sweeps.data_sources import BUILTIN_TOKENIZERS, vocab_size_of
from upscale.sweeps.errors import SpecError, SpecProblem, raise_if
from upscale.sweeps.model_dirs import DenseModelDir, confine_model_files, read_dense_model
from upscale.sweeps.segments import (
    MAX_CONTEXT,
    MAX_EXPERTS,
    MAX_TOKENS,
    MAX_VOCAB,
    MIN_EXPERTS,
    AuxLossCoef,
    Balancing,
    BalancingRate,
    DataSpec,
    DecayShape,
    Dispatch,
    ExpandSpec,
    Frozen,
    LrSearchSpec,
    Method,
    Routing,
    Shape,
    UpcycleSpec,
)
from upscale.sweeps.sizes import NAMED_SIZES, expert_widths
from upscale.sweeps.steps import resolve

# Methods whose identity varies with the `r` axis (Drop-Upcycling's re-initialised fraction, docs/methods.md). Others
# ignore `upcycling.r` and are planned once, so an r sweep never duplicates a naive upcycle.
R_METHODS = frozenset({"drop"})
METHODS: tuple[str, ...] = get_args(Method)

Budget = Annotated[float, Field(gt=0, le=MAX_TOKENS, description="Tokens (rounded to whole steps).")]
ExpertCount = Annotated[int, Field(le=MAX_EXPERTS)]

MAX_AXIS = 1000  # entries of one grid axis (sizes, experts, topk, r, budgets): the product is what gets planned
EXCERPT_CHARS = 80  # of a bad value quoted in a message
MAX_LR = 10.0  # a peak learning rate above this diverges at once: AdamW's useful range is ~1e-5..1e-1
MAX_BATCH = 1 << 20  # sequences per optimiser step
MIN_CPUS = 0.01  # per worker: Ray schedules fractions, but below this a segment would never finish
MAX_CPUS = 4096.0  # per worker process, as MAX_GPUS: beyond any node
MAX_GPUS = 64.0
MAX_GPU_MEMORY = 1 << 16  # GiB of one GPU: far above any made
MAX_WORKERS = 4096  # processes per segment


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """repr of ``value`` cut to ``limit`` characters, ellipsised: what an error message may quote of a bad value.
    A value's repr is built whole only when it is small; a big container is summarised without building it."""
    if isinstance(value, (list, dict, tuple, set)) and len(value) > limit:
        return f"<{type(value).__name__} of {len(value)} entries>"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _budget_list_problems(name: str, values: Sequence[float]) -> list[SpecProblem]:
    if not values:
        return [(name, "empty budget list; give at least one token budget")]
    out = []
    for i in range(1, len(values)):
        if values[i] == values[i - 1]:
            out.append((f"{name}[{i}]", f"duplicate budget {values[i]:g}"))
        elif values[i] < values[i - 1]:
            out.append((f"{name}[{i}]", f"budgets must be sorted ascending: {values[i]:g} after {values[i - 1]:g}"))
    return out


class ShapeEntry(Shape):
    """An explicit decoder shape, for sizes not in the named table."""

    name: str | None = Field(None, description="Label used in tags and `per_size`; default L{n_layer}-d{d_model}.")

    @property
    def label(self) -> str:
        return self.name or f"L{self.n_layer}-d{self.d_model}-h{self.n_head}"


class DenseSection(Frozen):
    """A dense model trained elsewhere that the sweep upcycles, instead of training dense models itself."""

    path: str = Field(min_length=1, description="An upscale model directory (config.json + weights.pt): written by "
                      "`upscale model import`, `upscale model init`, or a training checkpoint's model/ folder.")
    trained_tokens: int = Field(gt=0, le=MAX_TOKENS, description="Tokens it was trained on: its D1.")
    name: str | None = Field(None, min_length=1, description="Label in tags and `per_size`; default "
                             "imported-L{n_layer}-d{d_model}.")


class ModelSection(Frozen):
    sizes: list[str | ShapeEntry] | None = Field(
        None, max_length=MAX_AXIS, description=f"Dense sizes N1: named ({', '.join(NAMED_SIZES)}) or explicit "
        "{n_layer, d_model, n_head}. Give this or `dense`.")
    dense: DenseSection | None = Field(None, description="Start from this dense model instead of training `sizes`: "
                                       "its shape is the one N1, trained_tokens the one D1.")
    vocab_size: int | None = Field(None, ge=2, le=MAX_VOCAB, description="None: the tokeniser's (256 for bytes, "
                                   "data.bpe_vocab_size for bpe); with `dense`, the model's.")
    init_std: float = Field(0.02, gt=0, description="Std of the normal weight init (per size in `per_size`).")
    _dense_model: DenseModelDir | None = PrivateAttr(None)

    optional_fields: ClassVar[frozenset[str]] = frozenset({"dense"})

    @field_validator("sizes", mode="before")
    @classmethod
    def _sizes(cls, sizes: Any) -> list[str | ShapeEntry] | None:
        """Names or shapes, checked here rather than as a pydantic union so each entry gets one clear message."""
        if sizes is None:
            return None
        if not isinstance(sizes, list) or not sizes:
            raise SpecError([("", "give a list of at least one size")])
        if len(sizes) > MAX_AXIS:
            raise SpecError([("", f"{len(sizes)} sizes; at most {MAX_AXIS}")])
        problems: list[SpecProblem] = []
        out: list[str | ShapeEntry] = []
        for i, s in enumerate(sizes):
            if isinstance(s, str) and s not in NAMED_SIZES:
                problems.append((f"[{i}]", f"unknown size {excerpt(s)}; named sizes: {', '.join(NAMED_SIZES)}, or give "
                                 "{n_layer, d_model, n_head}"))
            elif not isinstance(s, str):
                try:
                    s = ShapeEntry.model_validate(s)
                except ValidationError as e:
                    problems += [(join_path(f"[{i}]", _dotted(err["loc"])), _message(err)) for err in e.errors()]
                    continue
            label = s if isinstance(s, str) else s.label
            if label in {x if isinstance(x, str) else x.label for x in out}:
                problems.append((f"[{i}]", f"size {label!r} listed twice"))
            out.append(s)
        raise_if(problems)
        return out

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> ModelSection:
        """Exactly one of sizes and dense; a dense model's directory is read here (after the caller's
        `check_path`, which a server uses to confine it to its data roots before anything reads it)."""
        if (self.sizes is None) == (self.dense is None):
            raise SpecError([("", "give exactly one of model.sizes (train dense models) and model.dense (start from "
                                  "a trained one)")])
        if self.dense is not None:
            check_path = (info.context or {}).get("check_path")
            try:
                if check_path is not None:
                    check_path(self.dense.path)
                    confine_model_files(self.dense.path, check_path)
                self._dense_model = read_dense_model(self.dense.path)
            except ValueError as e:  # ModelDirError, or the caller's refusal (upscale.data_roots.OutsideRoots)
                raise SpecError([("dense.path", str(e))]) from None
        return self

    @property
    def dense_model(self) -> DenseModelDir | None:
        """The dense model `dense` names, as read when the spec was validated."""
        return self._dense_model

    def dense_label(self) -> str:
        m = self._dense_model
        assert self.dense is not None and m is not None
        return self.dense.name or f"imported-L{m.shape.n_layer}-d{m.shape.d_model}"

    def shapes(self) -> dict[str, Shape]:
        """Size label -> shape, in the order given (the one imported model's, with `dense`)."""
        if self.sizes is None:
            return {self.dense_label(): self._dense_model.shape}
        return {s if isinstance(s, str) else s.label:
                NAMED_SIZES[s] if isinstance(s, str) else s.shape for s in self.sizes}


class MoeSection(Frozen):
    experts: list[ExpertCount] = Field(max_length=MAX_AXIS,
                                       description="n_expert values; every one is paired with every topk.")
    topk: list[ExpertCount] = Field(max_length=MAX_AXIS, description="Experts each token is routed to.")
    aux_loss_coef: AuxLossCoef = 1e-3
    routing: Routing = "softmax_topk"
    dispatch: Dispatch = "grouped"
    balancing: Balancing = "aux_loss"
    balancing_rate: BalancingRate = 1e-3

    optional_fields: ClassVar[frozenset[str]] = frozenset({"balancing", "balancing_rate"})

    def identity_omits(self) -> frozenset[str]:
        """The dispatch never changes a result, the routing only at top-1, the aux coefficient and the bias update
        rate only under their own balancing (`ModelSpec.identity_omits`)."""
        omit = {"dispatch"} if 1 in self.topk else {"dispatch", "routing"}
        omit.add("aux_loss_coef" if self.balancing == "loss_free" else "balancing_rate")
        return frozenset(omit)

    @model_validator(mode="after")
    def _check(self) -> MoeSection:
        problems: list[SpecProblem] = []
        least = f" (an MoE has at least {MIN_EXPERTS} experts)"
        for name, values, low, why in (("experts", self.experts, MIN_EXPERTS, least), ("topk", self.topk, 1, "")):
            if not values:
                problems.append((name, "empty list"))
            problems += [(f"{name}[{i}]", f"must be >= {low}, got {v}{why}") for i, v in enumerate(values) if v < low]
            problems += [(f"{name}[{i}]", f"duplicate value {v}") for i, v in enumerate(values) if v in values[:i]]
        for j, k in enumerate(self.topk):
            for i, e in enumerate(self.experts):
                if k > e:
                    problems.append((f"topk[{j}]", f"topk={k} exceeds experts={e} (experts[{i}]); every topk is "
                                     "paired with every expert count"))
        if self.balancing == "loss_free" and 1 in self.topk and self.routing == "softmax_topk":
            problems.append(("balancing", "loss_free with topk 1 and routing softmax_topk leaves the router without "
                             "gradient (its one weight is the constant 1, no aux loss is added); use routing "
                             "deepspeed or topk >= 2"))
        raise_if(problems)
        return self

    def configs(self) -> list[tuple[int, int]]:
        """(n_expert, topk) pairs of the grid."""
        return [(e, k) for e in self.experts for k in self.topk]


class UpcyclingSection(Frozen):
    methods: list[Method] = Field(max_length=MAX_AXIS, description=f"Upcycling methods: {', '.join(METHODS)}.")
    r: list[Annotated[float, Field(ge=0, le=1)]] = Field(
        [0.5], max_length=MAX_AXIS,
        description=f"Re-initialisation ratios; apply to {', '.join(sorted(R_METHODS))} only.")
    seed: int = Field(0, description="Seed of each method's random draws (router, re-initialised neurons).")
    options: dict[Method, dict[str, Any]] = Field(
        default_factory=dict, description="Per-method options, the fields of UpcycleSpec (e.g. drop: {index_mode}).")

    @model_validator(mode="after")
    def _check(self) -> UpcyclingSection:
        problems: list[SpecProblem] = []
        if not self.methods:
            problems.append(("methods", "give at least one method"))
        problems += [(f"methods[{i}]", f"method {m!r} listed twice") for i, m in enumerate(self.methods)
                     if m in self.methods[:i]]
        if not self.r:
            problems.append(("r", "empty list"))
        problems += [(f"r[{i}]", f"r={v} listed twice") for i, v in enumerate(self.r) if v in self.r[:i]]
        for method, opts in self.options.items():
            if method not in self.methods:
                problems.append((f"options.{method}", f"options for {method!r}, which is not in upcycling.methods"))
            axes = ("method", "seed", "r")
            problems += [(f"options.{method}.{key}", f"set {key} in upcycling.{key}s" if key == "method" else
                          f"set {key} in upcycling.{key}, not per method") for key in axes if key in opts]
            try:
                UpcycleSpec(method=method, **{k: v for k, v in opts.items() if k not in axes})
            except ValidationError as e:
                problems += [(f"options.{method}.{_dotted(err['loc'])}", err["msg"]) for err in e.errors()]
        raise_if(problems)
        return self

    def variants(self) -> list[UpcycleSpec]:
        """One UpcycleSpec per distinct (method, r): methods outside R_METHODS appear once, at their default r."""
        out = []
        for m in self.methods:
            opts = self.options.get(m, {})
            for r in self.r if m in R_METHODS else [None]:
                extra = {"r": r} if r is not None else {}
                out.append(UpcycleSpec(method=m, seed=self.seed, **opts, **extra))
        return out


PARENT_PATH_KEYS = ("checkpoint", "path", "model", "dir")  # what a parent given as a trained model would name


class ExpansionParent(Frozen):
    """An MoE parent of expert upcycling: the E x k MoE trained from scratch (its WSD trunk) to each D1."""

    n_expert: int = Field(le=MAX_EXPERTS, description="E: the parent's experts (>= 2: a dense model is upcycled, "
                          "not expanded).")
    topk: int = Field(le=MAX_EXPERTS, description="k: experts per token, 1..E; the expanded model keeps it.")

    @model_validator(mode="before")
    @classmethod
    def _trained_here(cls, data: Any) -> Any:
        """A parent is trained by the sweep (its trunk and decays are what D*_expand is measured against); a
        checkpoint or model folder named in its place is refused here, at plan time, saying so."""
        named = data if isinstance(data, str) else next(
            (data[k] for k in PARENT_PATH_KEYS if k in data), None) if isinstance(data, dict) else None
        if named is not None:
            raise ValueError(f"{named!r} is not an MoE parent this sweep can expand: a parent is the E x k MoE the "
                             f"sweep trains from scratch to every tokens.d1, written {{n_expert: E, topk: k}}; a "
                             f"trained checkpoint or model folder cannot be a parent")
        return data


class ExpansionSection(Frozen):
    """Expert upcycling: trained E-expert MoEs grown to m·E experts and trained on (docs/methods.md, "Expansion"),
    beside the m·E-expert MoE from scratch."""

    parents: list[ExpansionParent] = Field(max_length=MAX_AXIS, description="The MoE parents, each trained from "
                                           "scratch to every budget of tokens.d1.")
    factors: list[int] = Field(max_length=MAX_AXIS, description="m: each parent grows to m·E experts, then trains "
                               "every budget of tokens.d2.")
    strategies: list[Literal["uniform", "utility"]] = Field(
        ["uniform"], max_length=2, description="uniform: m copies of every expert; utility: copies in proportion to "
        "each expert's mean routing score on calibration tokens (ExpandSpec.strategy).")
    bias_noise: float = Field(0.01, ge=0, description="ExpandSpec.bias_noise: noise on a replica's loss-free bias.")
    r: float = Field(0.0, ge=0, le=1, description="ExpandSpec.r: Drop-Upcycling's re-initialised fraction of the "
                     "replicas; 0 = plain copies.")
    seed: int = Field(0, description="Seed of the bias noise, the re-initialised neurons and calibration windows.")

    @model_validator(mode="after")
    def _check(self) -> ExpansionSection:
        problems: list[SpecProblem] = []
        for name in ("parents", "factors", "strategies"):
            if not getattr(self, name):
                problems.append((name, "empty list"))
        for i, p in enumerate(self.parents):
            if p.n_expert < MIN_EXPERTS:
                problems.append((f"parents[{i}].n_expert", f"{p.n_expert}: an expansion grows a trained MoE of at "
                                 f"least {MIN_EXPERTS} experts; a dense parent is upcycled (upcycling.methods)"))
            elif not 1 <= p.topk <= p.n_expert:
                problems.append((f"parents[{i}].topk", f"topk={p.topk} is not valid for the parent's "
                                 f"n_expert={p.n_expert}; valid: 1..{p.n_expert}"))
            if p in self.parents[:i]:
                problems.append((f"parents[{i}]", f"parent {p.n_expert}x{p.topk} listed twice"))
        for j, m in enumerate(self.factors):
            if m < 2:
                problems.append((f"factors[{j}]", f"factor {m}: an expansion at least doubles the experts (m >= 2)"))
            elif m in self.factors[:j]:
                problems.append((f"factors[{j}]", f"factor {m} listed twice"))
            else:
                problems += [(f"factors[{j}]", f"{m} x {p.n_expert} experts (parents[{i}]) exceeds {MAX_EXPERTS}")
                             for i, p in enumerate(self.parents) if m * p.n_expert > MAX_EXPERTS]
        problems += [(f"strategies[{i}]", f"strategy {v!r} listed twice") for i, v in enumerate(self.strategies)
                     if v in self.strategies[:i]]
        raise_if(problems)
        return self

    def variants(self) -> list[ExpandSpec]:
        """One ExpandSpec per (factor, strategy)."""
        return [ExpandSpec(factor=m, strategy=s, bias_noise=self.bias_noise, r=self.r, seed=self.seed)
                for m in self.factors for s in self.strategies]

    def configs(self) -> list[tuple[int, int]]:
        """(n_expert, topk) of every MoE an expansion trains: the parents and the expanded models (and so their
        scratch arm), in order, once each."""
        return list(dict.fromkeys([(p.n_expert, p.topk) for p in self.parents] +
                                  [(m * p.n_expert, p.topk) for p in self.parents for m in self.factors]))


class TokensSection(Frozen):
    d1: list[Budget] | None = Field(None, max_length=MAX_AXIS, description="Dense budgets D1; each is also a "
                                    "dense-law observation. Not with model.dense, whose trained_tokens is D1.")
    d2: list[Budget] = Field(max_length=MAX_AXIS, description="Upcycled-MoE budgets D2, trained after each D1.")
    scratch: list[Budget] | None = Field(None, max_length=MAX_AXIS,
                                         description="From-scratch MoE budgets; omit for none.")

    @model_validator(mode="after")
    def _check(self) -> TokensSection:
        problems = [p for name in ("d1", "d2", "scratch") if getattr(self, name) is not None
                    for p in _budget_list_problems(name, getattr(self, name))]
        raise_if(problems)
        return self


class TokensOverride(Frozen):
    d1: list[Budget] | None = Field(None, max_length=MAX_AXIS)
    d2: list[Budget] | None = Field(None, max_length=MAX_AXIS)
    scratch: list[Budget] | None = Field(None, max_length=MAX_AXIS)

    @model_validator(mode="after")
    def _check(self) -> TokensOverride:
        raise_if([p for name in ("d1", "d2", "scratch") if getattr(self, name) is not None
                   for p in _budget_list_problems(name, getattr(self, name))])
        return self


class LrSection(Frozen):
    dense: float | None = Field(None, gt=0, le=MAX_LR, description="Peak LR of dense training (not used with "
                                "model.dense).")
    moe: float = Field(gt=0, le=MAX_LR, description="Peak LR of MoE training, upcycled or from scratch (paper A.6).")


class DecaySection(Frozen):
    fraction: float = Field(0.1, gt=0, le=1, description="Fraction of each budget spent decaying.")
    shape: DecayShape = Field("linear", description="linear, cosine or 1-sqrt.")
    final_lr_fraction: float = Field(0.1, ge=0, le=1, description="LR at the end of the decay / peak LR.")


class AdamWSection(Frozen):
    """AdamW settings; the defaults are the paper's Table 4."""

    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    grad_clip: float = Field(1.0, ge=0)


class TrainSection(Frozen):
    context: int = Field(ge=1, le=MAX_CONTEXT, description="Tokens per sequence.")
    batch_size: int = Field(ge=1, le=MAX_BATCH, description="Sequences per optimiser step.")
    lr: LrSection | None = Field(None, description="Fixed peak LRs; or use lr_search.")
    lr_search: LrSearchSpec | None = Field(None, description="Optuna search of the peak LR per model (family, size).")
    warmup_tokens: float = Field(ge=0, le=MAX_TOKENS, description="Linear warmup (rounded to whole steps).")
    decay: DecaySection = DecaySection()
    adamw: AdamWSection = AdamWSection()
    seed: int = Field(0, description="Seed of model init and training randomness.")
    round_tokens: Literal["nearest", "exact"] = Field(
        "nearest", description="Budgets not a multiple of batch_size*context: round to the nearest step, or refuse.")
    micro_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH, description="Sequences per forward pass on each "
                                         "worker, gradients accumulated over a step: must divide batch_size / "
                                         "resources.workers. None = the largest that fits the device's memory "
                                         "(docs/training.md). Changes memory, not results.")
    activation_checkpointing: bool = Field(False, description="Recompute each block's activations in the backward "
                                           "pass instead of keeping them: less memory for ~1/3 more compute. "
                                           "Changes memory, not results.")
    eval_every_tokens: float | None = Field(None, gt=0, le=MAX_TOKENS, description="Validate trunks and decays every "
                                            "this many tokens of the sweep's token axis, besides each segment's start "
                                            "and end: the points of their validation curves (docs/training.md). "
                                            "Rounded to whole steps of each size's batch_size*context as the budgets "
                                            "are (train.round_tokens). None = start and end only. Each validation "
                                            "costs a forward pass over data.eval_tokens; changes no result.")

    # Options that change how a step is computed or what is measured, not what it computes: absent at their default
    # from the spec's hash.
    optional_fields: ClassVar[frozenset[str]] = frozenset({"micro_batch_size", "activation_checkpointing",
                                                           "eval_every_tokens"})

    @model_validator(mode="after")
    def _check(self) -> TrainSection:
        problems: list[SpecProblem] = []
        if (self.lr is None) == (self.lr_search is None):
            problems.append(("lr", "give exactly one of train.lr {dense, moe} and train.lr_search"))
        if self.lr_search and self.lr_search.low >= self.lr_search.high:
            problems.append(("lr_search.low", f"low={self.lr_search.low} must be below high={self.lr_search.high}"))
        if self.lr_search and self.lr_search.high > MAX_LR:
            problems.append(("lr_search.high", f"{self.lr_search.high:g} is above the largest peak LR, {MAX_LR:g}"))
        raise_if(problems)
        return self


class SizeOverride(Frozen):
    """Per-size recipe (the paper's Table 5 varies batch, warmup, init and LR with size)."""

    batch_size: int | None = Field(None, ge=1, le=MAX_BATCH)
    micro_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH, description="train.micro_batch_size for this size.")
    warmup_tokens: float | None = Field(None, ge=0, le=MAX_TOKENS)
    lr: LrSection | None = None
    init_std: float | None = Field(None, gt=0)
    tokens: TokensOverride | None = None

    optional_fields: ClassVar[frozenset[str]] = frozenset({"micro_batch_size"})


class ResourcesSection(Frozen):
    cpus: float = Field(1, ge=MIN_CPUS, le=MAX_CPUS, description="CPUs per worker process.")
    gpus: float = Field(0, ge=0, le=MAX_GPUS, description="GPUs per worker process.")
    workers: int = Field(1, ge=1, le=MAX_WORKERS, description="Worker processes per segment (Ray Train when > 1).")
    gpu_memory: float | None = Field(None, gt=0, le=MAX_GPU_MEMORY, description="GiB of memory of one GPU, for the "
                                     "plan's memory check and micro-batch; None = GPU_MEMORY_GIB (80, an H100's).")

    optional_fields: ClassVar[frozenset[str]] = frozenset({"gpu_memory"})


class SweepSpec(Frozen):
    """A whole sweep: the grid and its training recipe."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="Sweep name.")
    description: str = ""
    model: ModelSection
    moe: MoeSection
    upcycling: UpcyclingSection
    expansion: ExpansionSection | None = Field(None, description="Expert upcycling (E -> m·E experts) beside the "
                                               "grid; omit for none.")
    tokens: TokensSection
    train: TrainSection
    data: DataSpec = DataSpec()
    resources: ResourcesSection = ResourcesSection()
    per_size: dict[str, SizeOverride] = Field(default_factory=dict, description="Overrides keyed by size label.")

    optional_fields: ClassVar[frozenset[str]] = frozenset({"expansion"})

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> SweepSpec:
        limit = (info.context or {}).get("max_segments")
        if limit is not None and (n := segment_bound(self)) > limit:  # before the checks that walk the whole grid
            raise SpecError([("", f"this grid plans up to {n:,} segments, over the limit of {limit:,} "
                                  "(UPSCALE_MAX_SEGMENTS); shrink model.sizes, moe.experts, moe.topk, "
                                  "upcycling.methods, upcycling.r or expansion.factors, or the token budget "
                                  "lists")])
        problems: list[SpecProblem] = []
        labels = list(self.model.shapes())
        problems += [(f"per_size.{k}", f"not a size of this sweep ({', '.join(labels)})")
                     for k in self.per_size if k not in labels]
        if self.train.lr_search:
            problems += [(f"per_size.{k}.lr", "train.lr_search sets the LR; drop this or use train.lr")
                         for k, o in self.per_size.items() if o.lr]
        w = self.resources.workers
        problems += [(path, f"batch_size={bs} does not split evenly over resources.workers={w}; use a multiple of {w}")
                     for path, bs in [("train.batch_size", self.train.batch_size)] +
                     [(f"per_size.{k}.batch_size", o.batch_size) for k, o in self.per_size.items() if o.batch_size]
                     if bs % w]
        if not problems:
            problems += self._micro_batch_problems()
        if self.model.dense is not None:
            problems += self._dense_problems((info.context or {}).get("check_path"))
        else:
            problems += self._sizes_problems()
        if self.expansion is not None:
            problems += self._expansion_problems()
        if not problems:
            problems += resolve(self).problems
        variants = self.upcycling.variants()
        for label, shape in self.model.shapes().items():
            for e, k in self.moe.configs():
                for up in variants:
                    try:
                        expert_widths(up, shape.d_ff, e, k)
                    except ValueError as err:
                        problems.append((f"upcycling.methods[{self.upcycling.methods.index(up.method)}]",
                                         f"{up.method} cannot build {label} as {e}x{k}: {err}"))
        raise_if(list(dict.fromkeys(problems)))
        return self

    def size_override(self, label: str) -> SizeOverride:
        """Size ``label``'s `per_size` entry, or an empty one: what its recipe overrides."""
        return self.per_size.get(label, SizeOverride())

    def micro_batch_size(self, label: str) -> int | None:
        """The micro-batch the spec gives size ``label`` (its per_size override, else train's); None = fit memory."""
        o = self.per_size.get(label)
        return o.micro_batch_size if o and o.micro_batch_size else self.train.micro_batch_size

    def micro_batch_path(self, label: str) -> str:
        """The field that sets size ``label``'s micro-batch, for a problem to name."""
        o = self.per_size.get(label)
        return f"per_size.{label}.micro_batch_size" if o and o.micro_batch_size else "train.micro_batch_size"

    def _micro_batch_problems(self) -> list[SpecProblem]:
        """A micro-batch divides each worker's share of its size's batch (a step is whole micro-batches)."""
        w, problems = self.resources.workers, []
        for label in self.model.shapes():
            o = self.size_override(label)
            rows = (o.batch_size or self.train.batch_size) // w
            micro = self.micro_batch_size(label)
            if micro and rows % micro:
                problems.append((self.micro_batch_path(label),
                                 f"{micro} does not divide the {rows} sequences each of {w} worker(s) takes per step "
                                 f"of {label}; use a divisor of {rows}"))
        return problems

    def _sizes_problems(self) -> list[SpecProblem]:
        """Dense models trained here need their budgets and, without an LR search, their LR."""
        problems: list[SpecProblem] = []
        if self.tokens.d1 is None:
            problems += [("tokens.d1", f"give the dense budgets D1 ({label} has none), or start from a trained model "
                                       "with model.dense") for label in self.model.shapes()
                         if not ((o := self.per_size.get(label)) and o.tokens and o.tokens.d1)]
        problems += [(path, "give the peak LR of dense training") for path, lr in
                     [("train.lr.dense", self.train.lr)] + [(f"per_size.{k}.lr.dense", o.lr)
                                                            for k, o in self.per_size.items()]
                     if lr is not None and lr.dense is None]
        return problems

    def _expansion_problems(self) -> list[SpecProblem]:
        """Parents train from scratch to the D1 budgets, so an imported dense model (no D1 list) has none; and the
        MoE section's routing and balancing apply to the parents as to every MoE of the grid."""
        assert self.expansion is not None
        problems: list[SpecProblem] = []
        if self.model.dense is not None:
            problems.append(("expansion", "the parents train from scratch to each budget of tokens.d1, which "
                                          "model.dense leaves out; expand in a sweep over model.sizes"))
        if self.moe.balancing == "loss_free" and self.moe.routing == "softmax_topk":
            problems += [(f"expansion.parents[{i}].topk", "topk 1 with moe.balancing loss_free and moe.routing "
                          "softmax_topk leaves the router without gradient; use moe.routing deepspeed or topk >= 2")
                         for i, p in enumerate(self.expansion.parents) if p.topk == 1]
        return problems

    def _dense_problems(self, check_path: Callable[[str], object] | None) -> list[SpecProblem]:
        """An imported dense model fixes D1, the vocabulary and the longest context; nothing dense is trained. The
        tokenizer's vocabulary is read here, so a path it names passes ``check_path`` first."""
        m = self.model.dense_model
        assert m is not None
        problems: list[SpecProblem] = []
        if self.tokens.d1 is not None:
            problems.append(("tokens.d1", "model.dense.trained_tokens is the D1 of an imported model; drop tokens.d1"))
        problems += [(f"per_size.{k}.tokens.d1", "model.dense.trained_tokens is the D1 of an imported model")
                     for k, o in self.per_size.items() if o.tokens and o.tokens.d1 is not None]
        if self.train.context > m.context:
            problems.append(("train.context", f"{self.train.context} exceeds the context of the model at "
                                              f"model.dense.path ({m.context})"))
        if check_path is not None and self.data.tokenizer not in BUILTIN_TOKENIZERS:
            try:
                check_path(self.data.tokenizer)
            except ValueError as e:
                return [*problems, ("data.tokenizer", str(e))]
        tokenizer_vocab = vocab_size_of(self.data)
        if tokenizer_vocab != m.vocab_size:
            problems.append(("data.tokenizer", f"the {self.data.tokenizer} tokeniser has {tokenizer_vocab} tokens; "
                                               f"the model at model.dense.path has vocab_size={m.vocab_size}"))
        if self.model.vocab_size is not None and self.model.vocab_size != m.vocab_size:
            problems.append(("model.vocab_size", f"{self.model.vocab_size} differs from vocab_size={m.vocab_size} "
                                                 "of the model at model.dense.path; drop it"))
        return problems


def segment_bound(spec: SweepSpec) -> int:
    """At most how many segments `planner.plan` makes of ``spec``, counted from its axes without enumerating them (the
    planner's DAG per size: a dense trunk piece and a decay per D1, or one dense_import; per (experts, topk) and
    upcycling variant, an upcycle, an MoE trunk piece and a decay per D2 after each D1; a scratch trunk piece and a
    decay per budget; per expansion parent, a scratch trunk piece and a decay per D1, and per (factor, strategy) an
    expand, an MoE trunk piece and a decay per D2 after each D1, and the expanded MoE's scratch arm; the LR
    searches). Shared segments and budgets with one decay start make the plan smaller, never larger."""
    variants = sum(len(spec.upcycling.r) if m in R_METHODS else 1 for m in spec.upcycling.methods)
    configs = len(spec.moe.experts) * len(spec.moe.topk)
    x = spec.expansion
    parents, grown = (len(x.parents), len(x.parents) * len(x.factors)) if x else (0, 0)
    total = 0
    for label in spec.model.shapes():
        override = spec.per_size.get(label)
        given = override.tokens if override and override.tokens else TokensOverride()
        d1, d2 = given.d1 or spec.tokens.d1 or [], given.d2 or spec.tokens.d2
        scratch = given.scratch if given.scratch is not None else spec.tokens.scratch
        dense_segments, dense_search = (2 * len(d1), 1) if spec.model.dense is None else (1, 0)
        searches = dense_search + configs if spec.train.lr_search else 0
        d1_count = len(d1) if spec.model.dense is None else 1
        per_config = variants * d1_count * (1 + 2 * len(d2)) + (2 * len(scratch) if scratch is not None else 0)
        expanded = 0
        if x:
            grown_scratch = len(scratch) if scratch is not None else d1_count * len(d2)  # the planner's budgets
            expanded = (parents * 2 * d1_count + grown * len(x.strategies) * d1_count * (1 + 2 * len(d2))
                        + grown * 2 * grown_scratch + ((parents + grown) if spec.train.lr_search else 0))
        total += dense_segments + searches + configs * per_config + expanded
    return total


def parse_spec(data: Any, max_segments: int | None = None,
               check_path: Callable[[str], object] | None = None) -> SweepSpec:
    """Validate a spec given as plain data (a dict from YAML/JSON or an API body); SpecError lists every problem.
    With ``max_segments``, a grid whose `segment_bound` exceeds it is refused before the grid-wide checks.
    ``check_path`` is called with `model.dense.path` and a tokenizer path before validation reads them, and raises
    ValueError to refuse one (a server confining them to its data roots)."""
    try:
        return SweepSpec.model_validate(data, context={"max_segments": max_segments, "check_path": check_path})
    except ValidationError as e:
        problems: list[SpecProblem] = []
        for err in e.errors():
            base = _dotted(err["loc"])
            cause = err.get("ctx", {}).get("error")
            if isinstance(cause, SpecError):  # a section's validator: paths relative to the section
                problems += [(join_path(base, path), msg) for path, msg in cause.problems]
            else:
                problems.append((base, _message(err)))
        raise SpecError(problems) from None


def _message(err: Any) -> str:
    """A pydantic error as a user reads it: our own validators' text, or pydantic's naming what was given."""
    cause = err.get("ctx", {}).get("error")
    if cause is not None:
        return str(cause)
    if err["type"] == "literal_error":  # an unknown method, decay shape or tokenizer
        return f"unknown value {excerpt(err['input'])}: {err['msg']}"
    return err["msg"]


# The example spec shipped with the package that `upscale demo` runs and the API shows as POST /sweeps' example.


def _dotted(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def join_path(base: str, path: str) -> str:
    if not path:
        return base
    return f"{base}{path}" if path.startswith("[") or not base else f"{base}.{path}"
