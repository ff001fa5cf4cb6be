"""The planner: compile a validated sweep into the smallest DAG of segments that reuses WSD checkpoints.

Per dense size N1 (docs/architecture.md, "Segments and WSD reuse"):

    dense_trunk ──► dense_decay(D1) ──► upcycle(E, k, method, r) ──► moe_trunk ──► moe_decay(D2)
    dense_import(D1) ──► upcycle ...      (model.dense: a model trained elsewhere replaces the dense trunk and decays)
    scratch_trunk(E, k) ──► scratch_decay(D)
    scratch_trunk(E, k) ──► scratch_decay(D1) ──► expand(m, strategy) ──► moe_trunk ──► moe_decay(D2)
                                                  (`expansion`; scratch_trunk(m·E, k) beside it)
    lr_search(dense | E×k)  ──► the trunks of that model, when the spec asks for an LR search

A trunk (dense, MoE, from scratch) is a chain of pieces cut at its branch points (the decay starts): piece i trains
[s_(i-1), s_i) of one warmup + constant-LR schedule from the piece before it and saves its final checkpoint, and the
decay branch of a budget resumes from the piece that ends at its decay start and ends at exactly its budget. A piece's
id is its parent's id plus its own span and schedule, never the later branch points, so a sweep grown by larger
budgets appends pieces and keeps every key it had. Segments are keyed by content id, so anything two grid points share
(a trunk piece, an upcycle that ignores r) is planned once, and two overlapping sweeps produce the same ids. A sweep
grown by an interior budget holds the same jobs under other keys (sweeps/reuse.py finds them).

An MoE config's scratch arm is one trunk cut at every budget any part of the grid asks of it: `tokens.scratch` for
the configs of `moe`, the D1 budgets for an expansion parent, and for an expanded m·E x k MoE `tokens.scratch`, or
without it the totals D1 + D2 of its expansions. So a parent that is also a config of `moe` is the same trunk.

Costs: training FLOPs = `sizes.train_flops_per_token` (active params, attention, LM head) x tokens; an upcycle is a
weight copy, as is an expansion (0 FLOPs). `independent_flops` is the same grid trained the usual way, every point
from scratch on its own schedule: D1 dense tokens per dense point, D1 dense + D2 MoE tokens per upcycled point, D1
parent MoE + D2 expanded MoE tokens per expanded point, D per scratch point (LR searches cost the same either way and
are in both; an imported dense model's training is in neither).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from upscale.sweeps.data_sources import resolve_data, vocab_size_of
from upscale.sweeps.model_dirs import weights_fingerprint
from upscale.sweeps.segments import (
    BUILD_KINDS,
    DenseImportSpec,
    LrSearchSpec,
    ModelSpec,
    OptimSpec,
    ScheduleSpec,
    SegmentKind,
    SegmentSpec,
    UpcycleSpec,
    fingerprint,
)
from upscale.sweeps.sizes import dense_params, expert_widths, moe_active_params, moe_total_params, train_flops_per_token
from upscale.sweeps.spec import R_METHODS, SweepSpec
from upscale.sweeps.steps import Budgets, SizeRecipe, decay_start_step, resolve, round_steps

AxisValue = str | int | float | None
LrChoice = tuple[float | None, tuple[str, ...]]  # (peak LR or None, the lr_search parents that will fix it)


@dataclass(frozen=True)
class Observation:
    """The axes of one observation a decay segment produces (its loss is filled in once it has run)."""

    kind: str  # "dense" | "upcycled" | "scratch" | "expanded"
    N1: int  # exact non-embedding params of the dense model (of the same shape, for scratch and expanded)
    D1: int | None = None  # dense tokens (dense: = D); expanded: the E-expert parent's
    D2: int | None = None  # upcycled- (expanded-) MoE tokens
    D: int | None = None  # tokens of a from-scratch run (dense or MoE)
    n_expert: int | None = None
    topk: int | None = None
    method: str | None = None
    r: float | None = None  # set only for methods that take r
    N2: int | None = None  # active non-embedding params of the MoE
    N_total: int | None = None  # all non-embedding params of the MoE
    parent_experts: int | None = None  # expanded: the parent MoE's experts E (n_expert = m·E)


@dataclass(frozen=True)
class PlannedSegment:
    """One node of the plan: the hashed spec and what the orchestrator needs around it."""

    spec: SegmentSpec
    id: str
    flops: float
    tokens: int
    observation: Observation | None
    trunk: str  # the trunk an observation comes from: decays their parent, trunks themselves, an upcycle the dense
    # trunk it descends from, lr_search ""
    axes: dict[str, AxisValue] = field(hash=False)


@dataclass(frozen=True)
class Plan:
    """A sweep compiled to segments in topological order (parents first)."""

    name: str
    segments: tuple[PlannedSegment, ...]
    independent_flops: float
    notes: tuple[str, ...] = ()  # how budgets were rounded to whole steps

    @property
    def total_flops(self) -> float:
        return sum(s.flops for s in self.segments)

    @property
    def saving(self) -> float:
        """Cost of the grid as independent runs / cost of this plan."""
        return self.independent_flops / self.total_flops

    def by_kind(self) -> dict[str, int]:
        return dict(Counter(s.spec.kind for s in self.segments))

    def observations(self) -> list[PlannedSegment]:
        """The segments that produce an observation (the decays), in plan order."""
        return [s for s in self.segments if s.observation is not None]


def trunk_pieces(whole: SegmentSpec, branch_points: Sequence[int], memo: dict | None = None) -> list[SegmentSpec]:
    """``whole`` (a trunk from its start to its last branch point, with the trunk's parents) cut into a chain of
    pieces at ``branch_points``: piece i covers [s_(i-1), s_i) of the same schedule, the first has the trunk's
    parents and every other the piece before it. So a piece's id is its parent's id plus its own span: a later,
    larger budget appends a piece and leaves every earlier key as it was."""
    pieces: list[SegmentSpec] = []
    start, parents = whole.start_tokens, whole.parent_ids
    for end in sorted(set(branch_points)):
        piece = whole.model_copy(update={"start_tokens": start, "end_tokens": end, "save_at_tokens": (),
                                         "parent_ids": parents})
        pieces.append(piece)
        start, parents = end, (fingerprint(piece, memo),)
    return pieces


class _Builder:
    """Accumulates segments, deduplicated by id, in the order they are added (parents are always added first)."""

    def __init__(self) -> None:
        self.segments: dict[str, PlannedSegment] = {}
        self._memo: dict = {}  # shared sub-models (model, data, optim, schedule) are canonicalised once

    def add(self, spec: SegmentSpec, flops_per_token: int, trunk: str | None, axes: dict[str, AxisValue],
            observation: Observation | None = None) -> str:
        sid = fingerprint(spec, self._memo)  # == spec.id
        if sid not in self.segments:
            tokens = spec.end_tokens - spec.start_tokens
            if spec.kind == "lr_search":
                tokens *= spec.lr_search.trials
            self.segments[sid] = PlannedSegment(spec, sid, float(flops_per_token * tokens), tokens, observation,
                                                sid if trunk is None else trunk, axes)
        return sid


def plan(spec: SweepSpec, data_roots: Sequence[Path] | None = None) -> Plan:
    """Compile `spec` into its segment DAG, with FLOPs per segment and the independent-runs cost. A server passes
    its ``data_roots``: no data file outside them is read (sweeps/data_sources.py)."""
    resolution = resolve(spec)
    # the data's content into segment identity
    spec = spec.model_copy(update={"data": resolve_data(spec.data, roots=data_roots)})
    b = _Builder()
    independent = 0.0
    for recipe in resolution.recipes:
        independent += _plan_size(spec, recipe, b)
    independent += sum(s.flops for s in b.segments.values() if s.spec.kind == "lr_search")
    return Plan(spec.name, tuple(b.segments.values()), independent, resolution.notes)


def _plan_size(spec: SweepSpec, rc: SizeRecipe, b: _Builder) -> float:
    """Add one dense size's segments; return the grid's independent-runs cost for this size."""
    t, tps, shape = spec.train, rc.tokens_per_step, rc.shape
    vocab = spec.model.vocab_size or vocab_size_of(spec.data)
    schedule = ScheduleSpec(warmup_tokens=rc.warmup_steps * tps, decay_fraction=t.decay.fraction,
                            decay_shape=t.decay.shape, final_lr_fraction=t.decay.final_lr_fraction)
    adamw = t.adamw.model_dump()
    batch = tps // t.context

    @functools.cache
    def optim(lr: float | None) -> OptimSpec:
        return OptimSpec(lr=lr, batch_size=batch, **adamw)

    options = dict(rc.imported.options) if rc.imported else {}  # what an imported model was built with

    def model(n_expert: int = 0, topk: int = 0) -> ModelSpec:
        balancing = {"balancing": spec.moe.balancing, "balancing_rate": spec.moe.balancing_rate} if n_expert else {}
        return ModelSpec(**shape.model_dump(), **options, vocab_size=vocab, context=t.context, n_expert=n_expert,
                         topk=topk, aux_loss_coef=spec.moe.aux_loss_coef, init_std=rc.init_std,
                         routing=spec.moe.routing, dispatch=spec.moe.dispatch, **balancing)

    common = {"data": spec.data, "seed": t.seed}
    n1 = dense_params(shape)
    base_axes: dict[str, AxisValue] = {"sweep": spec.name, "size": rc.label, "N1": n1, "n_expert": None,
                                       "topk": None, "method": None, "r": None, "D1": None, "D2": None, "D": None}

    def axes(kind: SegmentKind, **kv: AxisValue) -> dict[str, AxisValue]:
        return {**base_axes, "kind": kind, **kv}

    def lr_parent(m: ModelSpec, family: str, lr: float | None, f: int, **kv: AxisValue) -> LrChoice:
        """The peak LR of a trunk, or None and the lr_search segment that will fix it."""
        if t.lr_search is None:
            return lr, ()
        search = LrSearchSpec(trials=t.lr_search.trials, low=t.lr_search.low, high=t.lr_search.high,
                              tokens=round_steps(t.lr_search.tokens, tps) * tps)
        seg = SegmentSpec(kind="lr_search", model=m, optim=optim(None), schedule=schedule, lr_search=search,
                          end_tokens=search.tokens, **common)
        return None, (b.add(seg, f, "", axes("lr_search", family=family, **kv)),)

    def trunk_and_decays(kind: str, m: ModelSpec, lr: float | None, parents: tuple[str, ...], budgets: Budgets,
                         f: int, kv: dict[str, AxisValue], obs: Observation, budget_fields: tuple[str, ...]
                         ) -> list[str]:
        """A trunk as a chain of pieces cut at its branch points (`trunk_pieces`), then one decay branch per budget
        from the piece that ends at its decay start (each observing `obs` with its budget in `budget_fields`);
        returns the decay ids."""
        pieces = trunk_pieces(SegmentSpec(kind=f"{kind}_trunk", model=m, optim=optim(lr), schedule=schedule,
                                          end_tokens=max(budgets.decay_start_steps) * tps, parent_ids=parents,
                                          **common),
                              [s * tps for s in budgets.decay_start_steps])
        at: dict[int, str] = {}  # branch point -> the piece ending there
        root = None
        for piece in pieces:
            at[piece.end_tokens] = b.add(piece, f, root, axes(piece.kind, **kv))
            root = root or at[piece.end_tokens]  # every piece and branch of the chain is on the first piece's trunk
        out = []
        for steps, start in zip(budgets.steps, budgets.decay_start_steps, strict=True):
            end = steps * tps
            decay = SegmentSpec(kind=f"{kind}_decay", model=m, optim=optim(lr), schedule=schedule,
                                start_tokens=start * tps, end_tokens=end, decay_start_tokens=start * tps,
                                parent_ids=(at[start * tps],), **common)
            o = replace(obs, **dict.fromkeys(budget_fields, end))
            out.append(b.add(decay, f, root, axes(decay.kind, **{**kv, "D1": o.D1, "D2": o.D2, "D": o.D}), o))
        return out

    dense = model()
    f_dense = train_flops_per_token(shape, n1, t.context, vocab)
    d2_tokens = [s * tps for s in rc.d2.steps]
    if rc.imported is None:
        # Dense: one trunk, one decay per D1; each decay is a dense observation and an upcycling start point.
        lr_dense, parents = lr_parent(dense, "dense", rc.lr.dense if rc.lr else None, f_dense)
        d1_tokens = [s * tps for s in rc.d1.steps]
        dense_decays = trunk_and_decays("dense", dense, lr_dense, parents, rc.d1, f_dense, {},
                                        Observation("dense", n1), ("D1", "D"))
        dense_cost = f_dense * sum(d1_tokens)  # of one D1 row of upcycled points, trained independently
    else:
        # An imported dense model: the one upcycling start point and dense observation, trained elsewhere (its
        # training is in neither cost).
        assert spec.model.dense is not None
        d1 = spec.model.dense.trained_tokens
        source = DenseImportSpec(path=rc.imported.path, fingerprint=weights_fingerprint(rc.imported.path))
        seg = SegmentSpec(kind="dense_import", model=dense, dense_import=source, start_tokens=d1, end_tokens=d1,
                          **common)
        d1_tokens = [d1]
        dense_decays = [b.add(seg, 0, None, axes("dense_import", D1=d1, D=d1), Observation("dense", n1, D1=d1, D=d1))]
        dense_cost = 0
    independent = dense_cost

    @functools.cache
    def moe_config(n_expert: int, topk: int) -> tuple[ModelSpec, int, int, int, LrChoice]:
        """An MoE config's model, active and total params, FLOPs per token and LR (an lr_search's, when asked)."""
        moe = model(n_expert, topk)
        n2 = moe_active_params(shape, n_expert, topk)
        f_moe = train_flops_per_token(shape, n2, t.context, vocab)
        lr = lr_parent(moe, "moe", rc.lr.moe if rc.lr else None, f_moe, n_expert=n_expert, topk=topk)
        return moe, n2, moe_total_params(shape, n_expert), f_moe, lr

    arms = _scratch_steps(spec, rc)
    scratch_decays: dict[tuple[int, int], dict[int, str]] = {}  # config -> budget -> its scratch_decay

    def scratch_arm(n_expert: int, topk: int) -> float:
        """The config's scratch trunk and its decays at every budget of `arms`; their independent-runs cost."""
        steps = sorted(arms.get((n_expert, topk), ()))
        if not steps:
            return 0.0
        moe, n2, n_total, f_moe, (lr_moe, lr_parents) = moe_config(n_expert, topk)
        budgets = Budgets(tuple(steps), tuple(decay_start_step(s, t.decay.fraction) for s in steps))
        obs = Observation("scratch", n1, n_expert=n_expert, topk=topk, N2=n2, N_total=n_total)
        ids = trunk_and_decays("scratch", moe, lr_moe, lr_parents, budgets, f_moe,
                               {"n_expert": n_expert, "topk": topk}, obs, ("D",))
        scratch_decays[n_expert, topk] = {s * tps: sid for s, sid in zip(steps, ids, strict=True)}
        return f_moe * sum(s * tps for s in steps)

    variants: list[UpcycleSpec] = spec.upcycling.variants()
    for n_expert, topk in spec.moe.configs():
        moe, _, _, _, (lr_moe, moe_lr_parents) = moe_config(n_expert, topk)
        cfg = {"n_expert": n_expert, "topk": topk}
        for up in variants:
            widths = expert_widths(up, shape.d_ff, n_expert, topk)  # methods that split the FFN train narrower experts
            up_n2 = moe_active_params(shape, n_expert, topk, *widths)
            f_up = train_flops_per_token(shape, up_n2, t.context, vocab)
            r = up.r if up.method in R_METHODS else None
            for dense_id, d1 in zip(dense_decays, d1_tokens, strict=True):
                kv = {**cfg, "method": up.method, "r": r, "D1": d1}
                seg = SegmentSpec(kind="upcycle", model=moe, upcycle=up, parent_ids=(dense_id,), **common)
                up_id = b.add(seg, 0, b.segments[dense_id].trunk, axes("upcycle", **kv))
                obs = Observation("upcycled", n1, D1=d1, n_expert=n_expert, topk=topk, method=up.method, r=r,
                                  N2=up_n2, N_total=moe_total_params(shape, n_expert, *widths))
                trunk_and_decays("moe", moe, lr_moe, (up_id, *moe_lr_parents), rc.d2, f_up, kv, obs, ("D2",))
            independent += len(d2_tokens) * dense_cost + len(d1_tokens) * f_up * sum(d2_tokens)
        independent += scratch_arm(n_expert, topk)
    for config in arms:
        if config not in scratch_decays:  # an expansion's MoE that is no config of `moe`
            independent += scratch_arm(*config)

    x = spec.expansion
    for parent in x.parents if x is not None else ():
        e, k = parent.n_expert, parent.topk
        f_parent = moe_config(e, k)[3]
        for grow in x.variants():
            me = grow.factor * e
            grown, n2, n_total, f_grown, (lr_grown, lr_parents) = moe_config(me, k)
            method, r = grow.method, grow.r or None
            for d1 in d1_tokens:
                parent_id = scratch_decays[e, k][d1]
                kv = {"n_expert": me, "topk": k, "method": method, "r": r, "D1": d1, "parent_experts": e}
                seg = SegmentSpec(kind="expand", model=grown, expand=grow, parent_ids=(parent_id,), **common)
                grow_id = b.add(seg, 0, b.segments[parent_id].trunk, axes("expand", **kv))
                obs = Observation("expanded", n1, D1=d1, n_expert=me, topk=k, method=method, r=r, N2=n2,
                                  N_total=n_total, parent_experts=e)
                trunk_and_decays("moe", grown, lr_grown, (grow_id, *lr_parents), rc.d2, f_grown, kv, obs, ("D2",))
            independent += len(d2_tokens) * f_parent * sum(d1_tokens) + len(d1_tokens) * f_grown * sum(d2_tokens)
    return independent


def _scratch_steps(spec: SweepSpec, rc: SizeRecipe) -> dict[tuple[int, int], set[int]]:
    """(n_expert, topk) -> the budgets (steps) its scratch arm decays at: `tokens.scratch` for the configs of `moe`;
    an expansion parent's D1 budgets; an expanded MoE's `tokens.scratch`, or without it the totals D1 + D2 its
    expansions train."""
    out: dict[tuple[int, int], set[int]] = {}
    if rc.scratch is not None:
        for config in spec.moe.configs():
            out.setdefault(config, set()).update(rc.scratch.steps)
    x = spec.expansion
    if x is not None:
        assert rc.d1 is not None  # an expansion is refused with model.dense (sweeps/spec.py)
        totals = rc.scratch.steps if rc.scratch is not None else [a + b for a in rc.d1.steps for b in rc.d2.steps]
        for parent in x.parents:
            out.setdefault((parent.n_expert, parent.topk), set()).update(rc.d1.steps)
            for m in x.factors:
                out.setdefault((m * parent.n_expert, parent.topk), set()).update(totals)
    return out


# Default throughputs for the time estimate, when the user gives none.
# CPU, docs/architecture.md "Measured facts": 2-core fp32 peak ~200 GFLOP/s; a PyTorch training loop reaches
# ~50% of it at d_model >= 128 and ~33% at d_model = 64; DeepSpeed-MoE runs at ~0.5x a dense model per active FLOP.
CPU_PEAK_FLOPS_PER_S = 200e9
MOE_EFFICIENCY = 0.5
# GPU: the paper's Appendix A.10 assumption for an H100 (bf16, Megatron-LM), per GPU.
GPU_FLOPS_PER_S = 400e12
# Per-segment fixed cost on CPU: model build, checkpoint load/save (0.1-0.4 s each), task dispatch; a rounded guess.
SEGMENT_OVERHEAD_S = 1.0


def cpu_flops_per_s(m: ModelSpec) -> float:
    """Training FLOP/s a 2-core CPU sustains on model `m` (docs/architecture.md, "Measured facts")."""
    rate = CPU_PEAK_FLOPS_PER_S * (0.5 if m.d_model >= 128 else 0.33)
    return rate * (MOE_EFFICIENCY if m.is_moe else 1.0)


def gpu_flops_per_s(spec: SweepSpec) -> float | None:
    """Training FLOP/s of one segment of a GPU sweep: GPU_FLOPS_PER_S per GPU it holds (resources.gpus x workers);
    None for a CPU sweep, whose rate depends on each model (cpu_flops_per_s)."""
    gpus = spec.resources.gpus * spec.resources.workers
    return GPU_FLOPS_PER_S * gpus if gpus else None


def segment_seconds(p: Plan, tokens_per_s: float | None = None, flops_per_s: float | None = None) -> dict[str, float]:
    """Estimated seconds per segment of the plan (`seconds_of`)."""
    return {s.id: seconds_of(s.spec, s.flops, s.tokens, s.observation is not None, tokens_per_s, flops_per_s)
            for s in p.segments}


def seconds_of(spec: SegmentSpec, flops: float, tokens: int, observed: bool, tokens_per_s: float | None = None,
               flops_per_s: float | None = None) -> float:
    """Estimated seconds of one segment (``flops`` and ``tokens`` its training's, ``observed`` when it yields an
    observation): tokens / tokens_per_s, or FLOPs / flops_per_s, or else the CPU facts above, plus the per-segment
    overhead and, for decays, one forward pass over the held-out set (1/3 of training FLOPs). Takes the segment
    rather than a plan so that a stored sweep's segments are estimated without planning its spec again."""
    m = spec.model
    if spec.kind in BUILD_KINDS:
        return SEGMENT_OVERHEAD_S
    if spec.kind == "dense_import":  # trains nothing: the evaluation below at the model's training rate
        per_token = train_flops_per_token(m, dense_params(m), m.context, m.vocab_size)
    else:
        per_token = flops / tokens
    work = flops + (per_token / 3 * spec.data.eval_tokens if observed else 0.0)
    rate = per_token * tokens_per_s if tokens_per_s else flops_per_s or cpu_flops_per_s(m)
    return work / rate + SEGMENT_OVERHEAD_S


def critical_path_s(p: Plan, seconds: dict[str, float]) -> float:
    """Longest chain of dependent segments, in seconds: the wall time with unlimited parallel workers."""
    finish: dict[str, float] = {}
    for s in p.segments:
        finish[s.id] = seconds[s.id] + max((finish[q] for q in s.spec.parent_ids), default=0.0)
    return max(finish.values(), default=0.0)


def eta_s(planned_s: float, planned_done_s: float, elapsed_s: float, planned_waiting_s: float = 0.0,
          first: tuple[float, float] | None = None) -> float | None:
    """Seconds left of a run whose segments the plan estimates at ``planned_s`` in all, of which segments estimated at
    ``planned_done_s`` have finished ``elapsed_s`` seconds after the start: the plan's remainder at the pace measured
    so far (elapsed seconds per planned second) once a segment has finished. Before that, the plan's figure counted
    down, but never below ``planned_waiting_s``, the plan's figure for the segments not yet started (what has not
    begun has not got faster); None when only segments already running remain and they have outrun the plan's
    figure: there is no pace to go by yet, and 0 would be a false promise.

    ``first``: (elapsed seconds, planned seconds finished) when the first segments finished. The wait for them holds
    the run's one-off start-up (Ray's workers, their imports, DeepSpeed's op build), which a pace measured from the
    start would charge to every segment left: a demo whose first, small segment took minutes to start was told hours
    instead of minutes. Given it, the pace is measured from then on, and until another segment finishes the plan's
    remainder counts down from then."""
    if planned_done_s <= 0:
        left = max(planned_s - elapsed_s, planned_waiting_s)
        return left if left > 0 or planned_s <= 0 else None
    if first is not None:
        at, planned_first = first
        if planned_done_s <= planned_first:
            return eta_s(planned_s - planned_first, 0.0, elapsed_s - at, planned_waiting_s)
        planned_s, planned_done_s, elapsed_s = planned_s - planned_first, planned_done_s - planned_first, elapsed_s - at
    return max(planned_s - planned_done_s, 0.0) * elapsed_s / planned_done_s
