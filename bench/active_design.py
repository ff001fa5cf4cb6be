"""Active design against the anchor: how much of a full grid's FLOPs each way of choosing runs needs to pin D* down
as tightly as the full grid does. A simulation: nothing trains.

Ground truths: the upcycling paper's Table 2 laws (from-scratch MoE on (D, N1), upcycled `joint` on (D1, D2, N1),
E = 0.165) with their scales and exponents perturbed, kept so that D* at the target N1 falls inside the grid's
D1 = D2 range (7), near its edge (within 2x outside, 7) and outside it (2x to 8x, 6). Observations: the law's loss
times exp(trunk effect + point noise), both N(0, 0.005), the trunk being the planner's (every branch of one MoE or
from-scratch trunk shares its draw). The pool is the full grid of `GRID` at `BUDGETS` (or ``--budgets``) as the
planner plans it; an observation's cost is the planner's FLOPs over the DAG: its decay plus the part of every ancestor
it needs (a trunk up to its branch point), and what is already bought is free, so all methods are charged the
marginal FLOPs a store with reuse charges.

Every method starts from the same pilot (the cheapest corner: two sizes, two D1, two D2, three from-scratch budgets),
uses the same fitter (least squares on log loss, E fixed at the truth, warm-started), the same noise estimate
(fitting/design.py's moments of the residuals) and the same intervals (the delta method on log D* with the per-trunk
covariance, and the profile-likelihood interval of fitting/profile.py), and adds observations until its design's 80%
interval is as narrow as the full grid's (within SLACK). A design's width is the
delta-method width at the true laws and noise: what the observations bought can tell, not how lucky one draw's fit
was (a fitted width dips below the full grid's by chance on a poor fit, which the coverage then shows):

- random: a uniformly random remaining point; cost-random: with probability proportional to 1 / marginal cost;
  cheapest: the point of least marginal cost.
- anchor: Li et al., "Spend Less, Fit Better" (arXiv 2604.22753), as its paper describes it: one run at a time from
  the fixed pool, the expected reduction of the mean predictive variance over a target region (V-optimality: both
  laws' log losses at the target N1 over the grid's token range) under a mixture of Laplace approximations (fits
  from several starts, weighted by their likelihood), divided by (cost share)^0.4 with each run's own cost (a run
  from scratch: no shared prefixes); anchor-marginal: the same with marginal DAG costs.
- upscale: fitting/design.py's c-optimal criterion on log D* with the per-trunk covariance, over DAG actions (one
  branch, or all remaining branches of one trunk), by shrinkage per marginal FLOP.
- upscale_curves: the same with loss curves (bench/design_curves.py: every bought trunk piece and decay logs a curve
  drawn from a noise-floor law, not the multi-power law that predicts from it). Each family's curves predict the
  decay ends on the trained trunk parts (fitting/curve_observations.py), at the grid's budgets and at off-grid ones
  between them (bench/design_curves.py's `offgrid_ends`: never in the pool, and this method never buys them), which
  the fit takes as rows weighted by `prediction_weight` and the criterion as rows with their held-out sd; actions
  also include trunk extensions (to the next branch point, no decay), and a started trunk whose remaining decays
  cannot move D* at the fit nor at a few parameter draws from its covariance is stopped, re-examined every round
  (`StopRule`). Its design width counts its predicted rows with their measured sd; its intervals weigh them too.
  upscale_curves_grid_rows is the same without the off-grid rows, upscale_curves_no_stop without stopping (each part
  measured on the same cases).
- upscale_curves_any_branch: upscale_curves free to branch a decay anywhere along a trunk, as `upscale suggest`'s
  interior budgets do: the off-grid decays can be bought too, each observed as a grid decay is (its end drawn from
  the truth with its trunk's draw, its curve from the same noise-floor law) and charged its decay and its trunk only
  up to its branch point, which may lie inside a trunk piece (the curve it reveals stops there); on a trunk already
  trained past it, the span from the cut before it is retrained too (`Sim.retrain`). They never join the pool: the
  full grid's width stays the target. upscale_any_branch is today's design given the same freedom and no curve (its
  chooser's actions are branches and whole trunks, none predicted): what branching anywhere gains by itself.
- oracle_any_branch: upscale_any_branch choosing with its criterion read at the truth (the true laws, D* gradient
  and noise) instead of the fit: not a design anyone can run, but a reference for how much of a grid a design that
  chooses by this criterion needs even when every fit is exact (on the replay, the full grid's fit is the truth).
- grid_stop: the full planned grid in the order a scheduler finishes it (waves of equal tokens along the DAG), with
  curves and off-grid rows, refitting after each wave and stopping the trunks the same rule says cannot move D*; its
  fraction is where it reaches the full grid's width, ``grid_stop_spent`` what it spent by its end (at most 1).

Each ground truth is observed under several independent noise draws (``--draws``, 5 by default), and every method
runs on each (truth, draw) case; the figures are over all cases. Coverage is a probability over the noise: from one
draw per truth, 20 truths estimate an 80% coverage to within about ±0.09 (one standard error), too coarse to tell a
calibrated interval from one that covers 75%.

Figures: ``fraction_of_full_flops``: the median over cases of the FLOPs at which a method's design's 80% D* interval
first gets as narrow as the full grid's, over the full grid's FLOPs (1.0 when it never does before the pool is spent);
``coverage_80``: the share of cases whose true D* lies in the method's 80% profile-likelihood interval (the data and
the estimated noise) at that point, with ``coverage_80_se`` (its standard error, each truth's draws one cluster) and
``coverage_80_by_draw`` (the share over the truths in each draw alone), and ``coverage_80_delta`` the same for the
delta-method interval around the fit's D*; ``log10_dstar_error_at``: the median |log10 D̂* − log10 D*| after spending
10% and 20% of the full grid's FLOPs (an estimate with no crossing counts as ERROR_CAP decades); for the curve-aware
methods and grid_stop, ``predicted_share`` (median share of Var(log D*) at the true laws resting on predicted decays
where it got there), ``stopped_trunks`` (mean count stopped then) and ``stopped_flops`` (median FLOPs the stopped
trunks' rest would cost then, over the full grid's; for grid_stop what its stops saved by its end).

    nice -n 10 .venv/bin/python bench/active_design.py [--quick] [--seed S] [--truths N] [--draws K] [--workers W]
        [--methods a,b] [--until-width] [--budgets B1,B2,...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import cache

import numpy as np
from design_curves import GAIN_AT_1E9, CurveSim  # bench/design_curves.py: the curves a bought piece logs
from scipy.optimize import least_squares

from upscale.fitting.design import (
    STOP_GAIN,
    Z80,
    DstarCriterion,
    Noise,
    Rows,
    can_move,
    dstar_gradient,
    greedy,
    least_squares_covariance,
    log_loss_jacobian,
    noise_from_fits,
    prediction_weight,
)
from upscale.fitting.dstar import TOKEN_RANGE, crossings
from upscale.fitting.laws import get_law
from upscale.fitting.profile import Observed, profile_interval
from upscale.fitting.summary import FittedLaw
from upscale.fitting.synthetic import TABLE2
from upscale.sweeps.planner import Plan, plan
from upscale.sweeps.spec import parse_spec

BUDGETS = (5e8, 2e9, 8e9, 3.2e10)
GRID = {  # the D1, D2 and from-scratch budgets come from `grid_plan`: BUDGETS, or --budgets
    "name": "active-design-bench",
    "model": {"sizes": ["44M", "0.1B", "0.2B", "0.5B"]},
    "moe": {"experts": [8], "topk": [2]},
    "upcycling": {"methods": ["naive"]},
    "train": {"context": 1024, "batch_size": 512, "lr": {"dense": 3e-4, "moe": 2e-4}, "warmup_tokens": 1e8},
}
E = TABLE2["moe"]["E"]
NOISE = 0.005  # per trunk and per point, of log loss


@dataclass(frozen=True)
class StopRule:
    """When `stop_trunks` stops a trunk: only once sd(log D*) <= ``after_sd`` (a pilot's gradient may point
    anywhere), and only where all its remaining decays narrow sd(log D*) by less than ``gain`` of it at the fit and
    at each of ``draws`` parameter draws from the fit's covariance."""

    after_sd: float = 0.5
    gain: float = STOP_GAIN
    draws: int = 4
SLACK = 1.10  # "as narrow as the full grid's": within 10% of its width (a subset's information is never all of it)
ERROR_CAP = 3.0  # decades: the error of an estimate without a crossing
LAW = {"moe": get_law("chinchilla"), "up": get_law("joint")}
FREE = {k: tuple(n for n in law.param_names if n != "E") for k, law in LAW.items()}
CURVE_METHODS = {  # name: (off-grid predicted rows, stopping): upscale_curves, its parts switched off one by one,
    # and the same free to branch anywhere along a trunk
    "upscale_curves": (True, True), "upscale_curves_grid_rows": (False, True), "upscale_curves_no_stop": (True, False),
    "upscale_curves_any_branch": (True, True)}
ANY_BRANCH = "upscale_any_branch"  # today's design free to branch anywhere too, reading no curve
ORACLE = "oracle_any_branch"  # the same choosing at the truth: a reference, not a design anyone can run
ANYWHERE = {"upscale_curves_any_branch", ANY_BRANCH, ORACLE}  # the methods that may buy the off-grid decays too
METHODS = ("upscale", ANY_BRANCH, *CURVE_METHODS, ORACLE, "grid_stop", "anchor", "anchor_marginal", "random",
           "cost_random", "cheapest")
Seed = int | list[int]  # of one ground truth's noise draw: numpy takes a list as one seed


@dataclass(frozen=True)
class Point:
    """One observation of the pool: the law it informs, its coordinates, its trunk and its decay segment."""

    law: str  # "moe" (from scratch) or "up" (upcycled)
    coords: dict[str, float] = field(hash=False)
    trunk: str
    segment: str


@dataclass(frozen=True)
class Extension:
    """A trunk trained on to its next branch point without a decay: its curve predicts the decays on the new part."""

    trunk: str
    piece: str


@dataclass(frozen=True)
class DagSegment:
    """What ``Dag`` needs of a planned segment: its FLOPs over its tokens, its parents and where it starts/ends."""

    flops: float
    tokens: int
    parents: tuple[str, ...]
    start: int
    end: int


class Dag:
    """The planned DAG's FLOPs: what a set of observations costs, each ancestor charged up to where it is needed."""

    def __init__(self, segments: dict[str, DagSegment], full: float) -> None:
        self.segments, self.full = segments, full

    @classmethod
    def of_plan(cls, p: Plan) -> Dag:
        return cls({s.id: DagSegment(s.flops, s.tokens, tuple(s.spec.parent_ids), s.spec.start_tokens,
                                     s.spec.end_tokens) for s in p.segments}, p.total_flops)

    def cost(self, segments: set[str]) -> float:
        needed: dict[str, int] = {}
        stack: list[tuple[str, DagSegment | None]] = [(s, None) for s in segments]
        while stack:
            sid, child = stack.pop()
            seg = self.segments[sid]
            need = seg.end - seg.start
            if child is not None and seg.start < child.start < seg.end:
                need = child.start - seg.start  # a branch needs its trunk only to there
            if needed.get(sid, -1) >= need:
                continue
            needed[sid] = need
            stack.extend((parent, seg) for parent in seg.parents)
        return sum(self.segments[s].flops * n / max(self.segments[s].tokens, 1) for s, n in needed.items()
                   if self.segments[s].tokens)


def pool_of(p: Plan) -> list[Point]:
    out = []
    for s in p.observations():
        o = s.observation
        if o.kind == "scratch":
            out.append(Point("moe", {"D": float(o.D), "N": float(o.N1)}, s.trunk, s.id))
        elif o.kind == "upcycled":
            out.append(Point("up", {"D1": float(o.D1), "D2": float(o.D2), "N1": float(o.N1)}, s.trunk, s.id))
    return out


def table(points: list[Point], law: str) -> dict[str, np.ndarray]:
    rows = [p.coords for p in points if p.law == law]
    return {c: np.array([r[c] for r in rows]) for c in LAW[law].columns}


def draw_truths(n: int, target: float, rng: np.random.Generator,
                budgets: tuple[float, ...] = BUDGETS) -> list[tuple[dict, dict, float, str]]:
    """Perturbed Table 2 laws, ~a third each with D* inside, near the edge of and outside the grid's budgets."""
    lo, hi = min(budgets), max(budgets)
    wanted = {"inside": n - 2 * (n // 3), "edge": n // 3, "outside": n // 3}
    out = []
    while any(wanted.values()):
        moe = dict(TABLE2["moe"])
        up = dict(TABLE2["upcycled"])
        moe["A"] *= math.exp(rng.normal(0, 0.3))
        moe["alpha"] *= 1 + rng.normal(0, 0.06)
        moe["B"] *= math.exp(rng.normal(0, 0.1))
        up["A"] *= math.exp(rng.normal(0, 0.3))
        up["alpha2"] *= 1 + rng.normal(0, 0.06)
        up["B"] *= math.exp(rng.normal(0, 0.1))
        d = crossings(FittedLaw(LAW["moe"], moe), FittedLaw(LAW["up"], up), target).dstar
        if not (math.isfinite(d) and d > TOKEN_RANGE[0]):
            continue
        where = ("inside" if lo <= d <= hi else "edge" if lo / 2 <= d <= hi * 2
                 else "outside" if lo / 8 <= d <= hi * 8 else None)
        if where and wanted[where]:
            wanted[where] -= 1
            out.append((moe, up, d, where))
    return out


class Fitter:
    """The one fitter every method uses: least squares on log loss with E fixed, warm-started per law."""

    def __init__(self, e: float = E, nominal: dict[str, dict[str, float]] | None = None) -> None:
        """``e``: the fixed E; ``nominal``: each law's start (Table 2's by default), where a diverged fit restarts."""
        self.e = e
        nominal = nominal or {"moe": TABLE2["moe"], "up": TABLE2["upcycled"]}
        self.nominal = {k: np.array([LAW[k].param(n).to_fitted(nominal[k][n]) for n in FREE[k]]) for k in LAW}
        self.theta = {k: v.copy() for k, v in self.nominal.items()}
        self.params: dict[str, dict[str, float]] = {}
        self.residuals: dict[str, np.ndarray] = {}

    def to_params(self, law: str, theta: np.ndarray) -> dict[str, float]:
        return {"E": self.e, **{n: LAW[law].param(n).to_user(v) for n, v in zip(FREE[law], theta, strict=True)}}

    def fit(self, law: str, tab: dict[str, np.ndarray], y: np.ndarray, start: np.ndarray | None = None,
            weights: np.ndarray | None = None) -> float:
        """Fit ``law`` (each row's squared residual times its weight: 1 observed, `prediction_weight` predicted);
        returns the weighted sum of squared log residuals. ``residuals`` keeps them unweighted."""
        logy = np.log(y)
        root_w = np.ones(len(y)) if weights is None else np.sqrt(weights)

        def raw(theta: np.ndarray) -> np.ndarray:
            return np.log(LAW[law].predict(self.to_params(law, theta), tab)) - logy

        def resid(theta: np.ndarray) -> np.ndarray:
            return root_w * raw(theta)

        def jac(theta: np.ndarray) -> np.ndarray:
            return root_w[:, None] * log_loss_jacobian(LAW[law], self.to_params(law, theta), tab, FREE[law])[1]

        x0 = self.theta[law] if start is None else start
        with np.errstate(all="ignore"):
            if not np.all(np.isfinite(resid(x0))):  # a diverged start: back to the nominal law
                x0 = self.nominal[law]
            r = least_squares(resid, x0, jac=jac, x_scale="jac", max_nfev=200)
            if np.all(np.isfinite(r.x)) and np.all(np.isfinite(resid(r.x))):
                self.theta[law] = r.x
        self.params[law] = self.to_params(law, self.theta[law])
        with np.errstate(all="ignore"):
            self.residuals[law] = raw(self.theta[law])
        return float(((root_w * self.residuals[law]) ** 2).sum())


@dataclass
class State:
    """What a method has bought and what its fit says."""

    bought: list[Point]
    fitter: Fitter
    spent: float = 0.0
    dstar: float = float("nan")
    sd: float = float("inf")
    criterion: DstarCriterion | None = None
    noise: tuple[float, float] = (NOISE, NOISE)
    curves: bool = False  # whether bought curves predict decay ends (upscale_curves)
    offgrid: bool = False  # and decay ends off the grid's budgets along the trained trunk parts
    stopping: bool = False  # whether trunks that cannot move D* are stopped (re-examined every round)
    rule: StopRule = StopRule()
    log: list[tuple[tuple[str, ...], frozenset[str]]] = field(default_factory=list)  # each purchase (segments) and
    # the trunks stopped when it was made
    pieces: set[str] = field(default_factory=set)  # trunk pieces bought without a decay at their end
    predicted: dict[str, float] = field(default_factory=dict)  # decay segment -> its predicted end loss
    sd_pred: dict[str, float] = field(default_factory=dict)  # family (law) -> its predictions' held-out sd
    stopped: set[str] = field(default_factory=set)  # trunks that cannot move D* now: not extended or branched
    stopped_flops: float = 0.0  # what buying the rest of them would cost now

    def have(self) -> set[str]:
        return {q.segment for q in self.bought} | self.pieces


class Sim:
    """One ground truth: its noisy pool, the DAG costs and the shared fit/interval machinery."""

    def __init__(self, p: Plan, truth: tuple[dict, dict, float, str], target: float, seed: Seed,
                 budgets: tuple[float, ...] = BUDGETS) -> None:
        self.dag, self.pool, self.target = Dag.of_plan(p), pool_of(p), target
        self.true = {"moe": truth[0], "up": truth[1]}
        self.true_dstar = truth[2]
        rng = np.random.default_rng(seed)
        trunks = sorted({q.trunk for q in self.pool})
        effect = dict(zip(trunks, rng.normal(0, NOISE, len(trunks)), strict=True))
        self.y = {}
        for q in self.pool:
            mean = LAW[q.law].predict(self.true[q.law], {c: np.array([v]) for c, v in q.coords.items()})[0]
            self.y[q.segment] = mean * math.exp(effect[q.trunk] + rng.normal(0, NOISE))
        self.by_segment = {q.segment: q for q in self.pool}
        self.curves = CurveSim(p, self.end_loss, effect, self.y, GAIN_AT_1E9 * math.exp(rng.normal(0, 0.2)),
                               np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0]), NOISE)
        self.virtual = self.offgrid_points()
        self.offgrid_pool = self.observe_offgrid(p, effect, np.random.default_rng(np.random.SeedSequence(seed)
                                                                                  .spawn(3)[2]))
        self.pilot = self._pilot()
        self.budgets = list(budgets)
        self.oracle = Fitter()
        self.oracle.params = {k: dict(v) for k, v in self.true.items()}
        _, grad = dstar_gradient(FittedLaw(LAW["moe"], self.true["moe"]), FittedLaw(LAW["up"], self.true["up"]),
                                 target, FREE["moe"], FREE["up"])
        self.oracle_criterion = DstarCriterion(grad, self.rows(self.oracle, []), Noise(NOISE, NOISE))
        self.run_cost = {q.segment: self.dag.cost({q.segment}) for q in self.pool}

    def offgrid_points(self) -> dict[str, Point]:
        """The off-grid decays the curves predict, as points of their trunk's law (never in the pool: the grid's
        designs only learn their predicted loss; the `ANYWHERE` methods may buy them, `observe_offgrid`)."""
        out = {}
        for t, decays in self.curves.offgrid.items():
            q = next(q for q in self.pool if q.trunk == t)
            for key, _, _ in decays:
                coords = {**q.coords, "D" if q.law == "moe" else "D2": float(self.curves.offgrid_tokens(key))}
                out[key] = Point(q.law, coords, t, key)
        return out

    def observe_offgrid(self, p: Plan, effect: dict[str, float], rng: np.random.Generator) -> list[Point]:
        """The off-grid decays made buyable (by the `ANYWHERE` methods): each gets an observed end (the truth's law
        times its trunk's draw and its own noise), the curve its decay logs, and a segment of the DAG (its decay,
        costing what its trunk's grid decays cost per token, hanging from the trunk piece it branches from, which
        it needs only up to its branch point). Drawn from a stream of their own: the grid's draws stay put."""
        for key, q in self.virtual.items():
            mean = LAW[q.law].predict(self.true[q.law], {c: np.array([v]) for c, v in q.coords.items()})[0]
            self.y[key] = mean * math.exp(effect[q.trunk] + rng.normal(0, NOISE))
        self.curves.add_offgrid_curves(self.y, self.end_loss, effect, rng, NOISE)
        unit = self.curves.unit
        for t, decays in self.curves.offgrid.items():
            lay = self.curves.layout[t]
            grid = self.dag.segments[next(iter(lay.decays))]
            for key, branch, end in decays:
                start = branch * unit
                piece = lay.piece_reaching(start)[0]
                self.dag.segments[key] = DagSegment(grid.flops / grid.tokens * (end - branch) * unit,
                                                    (end - branch) * unit, (piece,), start, end * unit)
        return list(self.virtual.values())

    def point(self, key: str) -> Point:
        """A decay of the pool or an off-grid one, by its segment or key."""
        return self.by_segment.get(key) or self.virtual[key]

    def end_loss(self, trunk: str, tokens: float) -> float:
        """The truth's loss at the end of a decay at ``tokens`` on ``trunk`` (its size and D1 held)."""
        q = next(q for q in self.pool if q.trunk == trunk)
        coords = {**q.coords, "D" if q.law == "moe" else "D2": tokens}
        return float(LAW[q.law].predict(self.true[q.law], {c: np.array([v]) for c, v in coords.items()})[0])

    def _pilot(self) -> list[Point]:
        sizes = sorted({q.coords.get("N1", q.coords.get("N")) for q in self.pool})[:2]
        d = sorted({q.coords["D2"] for q in self.pool if q.law == "up"})  # the budgets as rounded to whole steps
        out = []
        for q in self.pool:
            if q.law == "up" and q.coords["N1"] in sizes and q.coords["D1"] in d[:2] and q.coords["D2"] in d[:2]:
                out.append(q)
            if q.law == "moe" and q.coords["N"] in sizes and q.coords["D"] in d[:3]:  # D1, D2, D share one rounding
                out.append(q)
        return out

    def cost(self, bought: list[Point], extra: list[Point]) -> float:
        return self.cost_segments({q.segment for q in bought}, {q.segment for q in extra})

    def cost_segments(self, have: set[str], extra: set[str]) -> float:
        return self.dag.cost(have | extra) - self.dag.cost(have) + self.retrain(have, extra)

    def retrain(self, have: set[str], extra: set[str]) -> float:
        """The FLOPs of retraining a trunk span for each off-grid decay in ``extra`` whose trunk ``have`` trained
        past its branch point: a trunk keeps checkpoints only at its cuts (its pieces' ends and the off-grid decays
        bought on it), so such a branch retrains from the cut before it, as a store's interior budget does."""
        flops = 0.0
        offgrid = self.virtual.keys()
        for key in offgrid & extra:
            seg, t = self.dag.segments[key], self.virtual[key].trunk
            if self.curves.reach(t, have) <= seg.start:
                continue
            piece = self.dag.segments[seg.parents[0]]
            cuts = [self.dag.segments[k].start for k in offgrid & (have | extra)
                    if self.virtual[k].trunk == t and piece.start <= self.dag.segments[k].start < seg.start]
            flops += piece.flops * (seg.start - max([piece.start, *cuts])) / piece.tokens
        return flops

    def rows(self, fitter: Fitter, points: list[Point]) -> dict[str, Rows]:
        """Observed rows, each keyed by its decay segment (it replaces a predicted row of that decay)."""
        out = {}
        for k in LAW:
            mine = [q for q in points if q.law == k]
            if not mine:
                out[k] = Rows.empty(len(FREE[k]))
                continue
            _, J = log_loss_jacobian(LAW[k], fitter.params[k], table(mine, k), FREE[k])
            out[k] = Rows(J, tuple(q.trunk for q in mine), np.zeros(len(mine)), tuple(q.segment for q in mine))
        return out

    def predicted_rows(self, fitter: Fitter, segments: list[str], sd_pred: dict[str, float]) -> dict[str, Rows]:
        """Rows of decays predicted from curves, with their family's held-out sd (none where it has no sd)."""
        out = {}
        for k in LAW:
            mine = [self.point(s) for s in segments if self.point(s).law == k and k in sd_pred]
            if not mine:
                out[k] = Rows.empty(len(FREE[k]))
                continue
            _, J = log_loss_jacobian(LAW[k], fitter.params[k], table(mine, k), FREE[k])
            out[k] = Rows.predicted(J, [q.trunk for q in mine], [q.segment for q in mine], sd_pred[k])
        return out

    def design_rows(self, fitter: Fitter, state: State) -> dict[str, Rows]:
        """What a design's fit sees: its observed rows, then its predicted ones."""
        observed = self.rows(fitter, state.bought)
        predicted = self.predicted_rows(fitter, list(state.predicted), state.sd_pred)
        return {k: observed[k] + predicted[k] for k in LAW}

    def predict(self, state: State) -> None:
        """Each family's predicted decay ends from the curves bought (refitted only when they changed)."""
        have = state.have()
        state.predicted, state.sd_pred = {}, {}
        for k in LAW:
            pred, losses = self.curves.predictions(k, have)
            if pred is not None and pred.usable:
                state.sd_pred[k] = pred.sd
                state.predicted.update({d: v for d, v in losses.items() if state.offgrid or d in self.by_segment})

    def refit(self, state: State, laws: set[str], start: dict[str, np.ndarray] | None = None) -> None:
        if state.curves:
            before = (dict(state.predicted), dict(state.sd_pred))
            self.predict(state)
            if before != (state.predicted, state.sd_pred):  # new predictions move both fits' rows or weights
                laws = set(LAW)
        for k in laws:
            mine = [q for q in state.bought if q.law == k]
            guessed = [s for s in state.predicted if self.point(s).law == k]
            w = prediction_weight(state.noise[0], state.sd_pred[k]) if guessed else 1.0
            state.fitter.fit(k, table(mine + [self.point(s) for s in guessed], k),
                             np.array([self.y[q.segment] for q in mine] + [state.predicted[s] for s in guessed]),
                             None if start is None else start.get(k),
                             np.concatenate([np.ones(len(mine)), np.full(len(guessed), w)]))
        self.assess(state)

    def assess(self, state: State) -> None:
        f = state.fitter
        moe, up = FittedLaw(LAW["moe"], f.params["moe"]), FittedLaw(LAW["up"], f.params["up"])
        rows = self.design_rows(f, state)
        observed = self.rows(f, state.bought)  # the noise is the observed rows' (they come first in the fit)
        noise = noise_from_fits([(f.residuals[k][:len(observed[k])], observed[k]) for k in LAW])
        state.noise = (noise.point_sd, noise.trunk_sd)
        state.dstar, grad = dstar_gradient(moe, up, self.target, FREE["moe"], FREE["up"])
        crossing = grad is not None
        if not crossing:  # aim at the gap where the grid ends, the closest the data come to one
            grad = self.gap_gradient(f)
        state.criterion = DstarCriterion(grad, rows, noise)
        state.sd = state.criterion.sd() if crossing else float("inf")

    def gap_gradient(self, f: Fitter) -> np.ndarray:
        d = np.array([max(self.budgets)])
        lm, jm = log_loss_jacobian(LAW["moe"], f.params["moe"], {"D": d, "N": np.full(1, self.target)}, FREE["moe"])
        lu, ju = log_loss_jacobian(LAW["up"], f.params["up"], {"D1": d, "D2": d, "N1": np.full(1, self.target)},
                                   FREE["up"])
        return np.concatenate([lm[0] * jm[0], -lu[0] * ju[0]])

    def plausible(self, state: State, k: int, rng: np.random.Generator) -> list[tuple[Fitter, DstarCriterion | None]]:
        """``k`` fits drawn from the current one's sampling distribution (each law's θ̂ plus a draw of its
        least-squares covariance under the design's rows and noise), each with its criterion; None where the drawn
        laws do not cross (nothing can be said to be out of D*'s reach there)."""
        rows = self.design_rows(state.fitter, state)
        noise = state.criterion.noise
        covs = {k_: least_squares_covariance(rows[k_], noise.point_sd, noise.trunk_sd) for k_ in LAW}
        out: list[tuple[Fitter, DstarCriterion | None]] = []
        for _ in range(k):
            f = self.fitter()
            for law in LAW:
                if not np.all(np.isfinite(covs[law])):
                    return []
                theta = rng.multivariate_normal(state.fitter.theta[law], covs[law], check_valid="ignore")
                f.params[law] = f.to_params(law, theta)
            _, grad = dstar_gradient(FittedLaw(LAW["moe"], f.params["moe"]), FittedLaw(LAW["up"], f.params["up"]),
                                     self.target, FREE["moe"], FREE["up"])
            out.append((f, None if grad is None else DstarCriterion(grad, self.design_rows(f, state), noise)))
        return out

    def fitter(self) -> Fitter:
        """A fresh fit with this case's E and start (the oracle's E: the truth's, or the replay's shared fit's)."""
        return Fitter(self.oracle.e)

    def width(self, bought: list[Point], state: State | None = None) -> float:
        """The 80% width of log D* that a design gives at the true laws and noise (its predicted rows with the sd
        their held-out decays measured): what it buys, free of how lucky one draw's fit and noise estimate were."""
        return 2 * Z80 * self.at_truth(bought, state).sd()

    def at_truth(self, bought: list[Point], state: State | None = None) -> DstarCriterion:
        rows = self.rows(self.oracle, bought) if state is None else self.design_rows(self.oracle, state)
        return DstarCriterion(self.oracle_criterion.gradient, rows, self.oracle_criterion.noise)

    def covers_delta(self, state: State) -> bool:
        """Whether the delta-method 80% interval around the fit's D* holds the true D* (none without a crossing)."""
        if not (math.isfinite(state.dstar) and math.isfinite(state.sd)):
            return False
        return abs(math.log(self.true_dstar) - math.log(state.dstar)) <= state.criterion.quantile(0.8) * state.sd

    def covers(self, state: State) -> bool:
        """Whether upscale's 80% interval, the profile-likelihood one of fitting/profile.py, holds the true D*."""
        observed = {}
        for k in LAW:
            mine = [q for q in state.bought if q.law == k]
            guessed = [s for s in state.predicted if self.point(s).law == k]
            extra = np.concatenate([np.zeros(len(mine)), np.full(len(guessed), state.sd_pred.get(k, 0.0) ** 2)])
            observed[k] = Observed(LAW[k], state.fitter.params[k], FREE[k],
                                   table(mine + [self.point(s) for s in guessed], k),
                                   np.array([self.y[q.segment] for q in mine] + [state.predicted[s] for s in guessed]),
                                   tuple(q.trunk for q in mine) + tuple(self.point(s).trunk for s in guessed),
                                   extra)
        interval = profile_interval(observed["moe"], observed["up"], self.target, state.criterion.noise,
                                    state.criterion.quantile(0.8), 0.8)
        return interval.covers(self.true_dstar)

    def error(self, state: State) -> float:
        if not (math.isfinite(state.dstar) and state.dstar > 0):
            return ERROR_CAP
        return min(abs(math.log10(state.dstar) - math.log10(self.true_dstar)), ERROR_CAP)


Chooser = Callable[[Sim, State, list[Point], np.random.Generator], list[Point]]


def choose_random(sim: Sim, state: State, left: list[Point], rng: np.random.Generator) -> list[Point]:
    return [left[rng.integers(len(left))]]


def choose_cost_random(sim: Sim, state: State, left: list[Point], rng: np.random.Generator) -> list[Point]:
    w = np.array([1.0 / max(sim.cost(state.bought, [q]), 1.0) for q in left])
    return [left[rng.choice(len(left), p=w / w.sum())]]


def choose_cheapest(sim: Sim, state: State, left: list[Point], rng: np.random.Generator) -> list[Point]:
    return [min(left, key=lambda q: (sim.cost(state.bought, [q]), q.segment))]


def upscale_actions(left: list[Point]) -> list[tuple[Point, ...]]:
    """One branch, or every remaining branch of one trunk: the DAG extensions the criterion weighs."""
    by_trunk: dict[str, list[Point]] = {}
    for q in left:
        by_trunk.setdefault(q.trunk, []).append(q)
    actions: list[tuple[Point, ...]] = [(q,) for q in left]
    actions += [tuple(qs) for qs in by_trunk.values() if len(qs) > 1]
    return actions


def greedy_branch(sim: Sim, state: State, left: list[Point], rng: np.random.Generator, criterion: DstarCriterion,
                  fitter: Fitter) -> list[Point]:
    """The action (`upscale_actions`) that shrinks ``criterion``'s sd most per marginal FLOP, its rows at ``fitter``'s
    laws; the cheapest branch where none shrinks it."""
    actions = upscale_actions(left)
    rows = {a: sim.rows(fitter, list(a)) for a in actions}
    have = state.have()
    steps, _ = greedy(criterion, actions, rows.__getitem__,
                      lambda chosen, a: sim.cost_segments(have, {q.segment for q in a}), math.inf, limit=1)
    if not steps:  # nothing the criterion can tell apart: the cheapest branch
        return choose_cheapest(sim, state, left, rng)
    return list(steps[0].action)


def choose_upscale(sim: Sim, state: State, left: list[Point], rng: np.random.Generator) -> list[Point]:
    return greedy_branch(sim, state, left, rng, state.criterion, state.fitter)


def choose_oracle(sim: Sim, state: State, left: list[Point], rng: np.random.Generator) -> list[Point]:
    """Today's criterion read at the truth (its laws, its D* gradient and noise) rather than at the fit: what its
    greedy choices would cost if every fit were exact, so what no design choosing by it can beat by much."""
    return greedy_branch(sim, state, left, rng, sim.at_truth(state.bought), sim.oracle)


def choose_upscale_curves(sim: Sim, state: State, left: list[Point],
                          rng: np.random.Generator) -> list[Point] | Extension:
    """upscale's criterion with curves: besides branches (at any point, interior ones of a bought trunk part cost
    only their decay) and whole trunks, a trunk may be extended to its next branch point, its curve predicting the
    decays there; an action is credited with the predicted rows the trunk pieces it buys yield (its family's sd), and
    observing a predicted decay only with what its prediction did not tell. Stopped trunks are out."""
    have = state.have()
    live = [q for q in left if q.trunk not in state.stopped]
    actions: list[tuple[Point, ...] | Extension] = list(upscale_actions(live))
    for t, lay in sim.curves.layout.items():
        n = sim.curves.trained(t, have)
        if t not in state.stopped and n < len(lay.pieces) and lay.family in state.sd_pred:
            actions.append(Extension(t, lay.pieces[n][0]))

    def bought_by(a: tuple[Point, ...] | Extension) -> set[str]:
        return {a.piece} if isinstance(a, Extension) else {q.segment for q in a}

    def rows_of(a: tuple[Point, ...] | Extension) -> dict[str, Rows]:
        after = have | bought_by(a)
        trunks = {a.trunk} if isinstance(a, Extension) else {q.trunk for q in a}
        newly = [d for t in trunks for d in sim.curves.predictable(t, sim.curves.reach(t, after), state.offgrid)
                 if d not in after and d not in state.predicted]
        observed = sim.rows(state.fitter, [] if isinstance(a, Extension) else list(a))
        guessed = sim.predicted_rows(state.fitter, newly, state.sd_pred)
        return {k: observed[k] + guessed[k] for k in LAW}

    steps, _ = greedy(state.criterion, actions, rows_of, lambda chosen, a: sim.cost_segments(have, bought_by(a)),
                      math.inf, limit=1)
    if not steps:
        return choose_cheapest(sim, state, live, rng)
    return steps[0].action if isinstance(steps[0].action, Extension) else list(steps[0].action)


def stop_trunks(sim: Sim, state: State, left: list[Point], rng: np.random.Generator) -> None:
    """Re-examined every round: a started trunk is stopped while all its remaining decays at once cannot narrow D*'s
    interval (`can_move`) at the fit AND at each of the rule's parameter draws from the fit's covariance, and resumed
    as soon as a refit says it can again (its marginal FLOPs are the DAG's either way); see `StopRule`."""
    rule = state.rule
    state.stopped, state.stopped_flops = set(), 0.0
    if not state.sd <= rule.after_sd:
        return
    have = state.have()
    rests = {t: [q for q in left if q.trunk == t] for t in sim.curves.layout}
    rests = {t: rest for t, rest in rests.items() if rest and sim.curves.reach(t, have)}
    if not rests:
        return
    views = [(state.fitter, state.criterion), *sim.plausible(state, rule.draws, rng)]
    for t, rest in rests.items():
        if all(c is not None and not can_move(c, sim.rows(f, rest), rule.gain) for f, c in views):
            state.stopped.add(t)
            state.stopped_flops += sim.cost_segments(have, {q.segment for q in rest})


def _laplace_components(sim: Sim, state: State) -> list[tuple[float, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """The anchor's mixture: fits of each law from the current optimum, the nominal start and a perturbed one, each
    with its Laplace covariance s²(JᵀJ)⁻¹ and a weight from its likelihood; duplicates merged."""
    comps = []
    base = {k: state.fitter.theta[k].copy() for k in LAW}
    starts = [base, {k: state.fitter.nominal[k] for k in LAW}, {k: base[k] * 1.05 for k in LAW}]
    s2 = max(state.noise[0] ** 2 + state.noise[1] ** 2, 1e-12)
    for start in starts:
        f = sim.fitter()
        sse = 0.0
        covs, thetas = {}, {}
        for k in LAW:
            mine = [q for q in state.bought if q.law == k]
            sse += f.fit(k, table(mine, k), np.array([sim.y[q.segment] for q in mine]), start[k])
            _, J = log_loss_jacobian(LAW[k], f.params[k], table(mine, k), FREE[k])
            covs[k] = s2 * np.linalg.pinv(J.T @ J, rcond=1e-12, hermitian=True)
            thetas[k] = f.theta[k]
        if any(all(np.allclose(thetas[k], c[3][k], rtol=1e-4, atol=1e-6) for k in LAW) for c in comps):
            continue
        comps.append((-sse / (2 * s2), covs, f.params, thetas))
    top = max(c[0] for c in comps)
    w = np.array([math.exp(c[0] - top) for c in comps])
    w /= w.sum()
    return [(wi, c[1], c[2]) for wi, c in zip(w, comps, strict=True)]


def _target_rows(sim: Sim, params: dict[str, dict[str, float]]) -> dict[str, np.ndarray]:
    d = np.geomspace(min(sim.budgets) / 2, max(sim.budgets) * 2, 8)
    n = np.full(d.shape, sim.target)
    return {"moe": log_loss_jacobian(LAW["moe"], params["moe"], {"D": d, "N": n}, FREE["moe"])[1],
            "up": log_loss_jacobian(LAW["up"], params["up"], {"D1": d, "D2": d, "N1": n}, FREE["up"])[1]}


def anchor_chooser(marginal: bool) -> Chooser:
    def choose(sim: Sim, state: State, left: list[Point], rng: np.random.Generator) -> list[Point]:
        comps = _laplace_components(sim, state)
        s2 = max(state.noise[0] ** 2 + state.noise[1] ** 2, 1e-12)
        total = sum(sim.run_cost.values())
        score = np.zeros(len(left))
        for w, covs, params in comps:
            targets = _target_rows(sim, params)
            for k in LAW:
                idx = [i for i, q in enumerate(left) if q.law == k]
                if not idx:
                    continue
                x = log_loss_jacobian(LAW[k], params[k], table([left[i] for i in idx], k), FREE[k])[1]
                cx = x @ covs[k]  # (cand, p)
                reduction = ((targets[k] @ cx.T) ** 2).mean(axis=0) / (s2 + (cx * x).sum(axis=1))
                score[idx] += w * reduction
        costs = np.array([sim.cost(state.bought, [q]) if marginal else sim.run_cost[q.segment] for q in left])
        share = np.maximum(costs, 1.0) / total
        return [left[int(np.argmax(score / share ** 0.4))]]
    return choose


CHOOSERS: dict[str, Chooser] = {"upscale": choose_upscale, ANY_BRANCH: choose_upscale, ORACLE: choose_oracle,
                                **{m: choose_upscale_curves for m in CURVE_METHODS},
                                "anchor": anchor_chooser(False),
                                "anchor_marginal": anchor_chooser(True), "random": choose_random,
                                "cost_random": choose_cost_random, "cheapest": choose_cheapest}


@dataclass(frozen=True)
class Outcome:
    fraction: float  # FLOPs to reach the full grid's width / full grid FLOPs (1.0: never before the pool ran out)
    covered: bool  # true D* inside the profile 80% interval where it got there (or at the end)
    covered_delta: bool  # and inside the delta-method one
    error_at: dict[str, float]  # log10 error of D̂* after 10% and 20% of the full FLOPs
    predicted_share: float = math.nan  # of D*'s precision, resting on predicted decays where it got there
    stopped: int = 0  # trunks stopped by then
    stopped_flops: float = 0.0  # what the rest of them would have cost, over the full grid's FLOPs (grid_stop: what
    # its stops saved in all, the full grid's FLOPs less what it spent by its end)
    spent_total: float = math.nan  # grid_stop: all it spent by its end, over the full grid's FLOPs


def stop_rng(seed: Seed) -> np.random.Generator:
    """The parameter draws of `stop_trunks`: a stream of their own, so that stopping leaves the choosers' alone."""
    return np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1])


def run_method(sim: Sim, name: str, width_full: float, seed: Seed, until_width: bool = False) -> Outcome:
    """One design on one case, run until it reaches the full grid's width and has spent 0.2 of the full FLOPs (for
    the error figures), or only until the width with ``until_width``."""
    if name == "grid_stop":
        return run_grid_stop(sim, width_full, seed)
    rng, draws = np.random.default_rng(seed), stop_rng(seed)
    offgrid, stopping = CURVE_METHODS.get(name, (False, False))
    state = State(list(sim.pilot), sim.fitter(), curves=name in CURVE_METHODS, offgrid=offgrid, stopping=stopping)
    state.spent = sim.cost([], state.bought)
    sim.refit(state, set(LAW), None)
    left = [q for q in sim.pool if q not in set(state.bought)] + (sim.offgrid_pool if name in ANYWHERE else [])
    full = sim.dag.full
    errors = {f: sim.error(state) for f in ("0.1", "0.2")}
    reached: Outcome | None = None

    def outcome(fraction: float) -> Outcome:
        share = sim.at_truth(state.bought, state).predicted_share() if state.curves else math.nan
        return Outcome(fraction, sim.covers(state), sim.covers_delta(state), errors, share,
                       len(state.stopped), state.stopped_flops / full)

    while True:
        if reached is None and sim.width(state.bought, state) <= width_full * SLACK:
            reached = outcome(state.spent / full)
        if state.stopping:
            stop_trunks(sim, state, left, draws)
        live = [q for q in left if q.trunk not in state.stopped]
        if (reached is not None and (until_width or state.spent >= 0.2 * full)) or not live:
            break
        picked = CHOOSERS[name](sim, state, live, rng)
        state.log.append(((picked.piece,) if isinstance(picked, Extension) else tuple(q.segment for q in picked),
                          frozenset(state.stopped)))
        if isinstance(picked, Extension):
            state.spent += sim.cost_segments(state.have(), {picked.piece})
            state.pieces.add(picked.piece)
            sim.refit(state, set())
        else:
            state.spent += sim.cost_segments(state.have(), {q.segment for q in picked})
            state.bought += picked
            picked_set = set(picked)
            left = [q for q in left if q not in picked_set]
            sim.refit(state, {q.law for q in picked})
        for f in ("0.1", "0.2"):
            if state.spent <= float(f) * full:
                errors[f] = sim.error(state)
    if reached is None:
        reached = outcome(1.0)
    return reached


def path_tokens(q: Point) -> float:
    """Tokens from the start of the DAG to the end of ``q``'s decay: the order a scheduler finishes the grid in."""
    return q.coords["D"] if q.law == "moe" else q.coords["D1"] + q.coords["D2"]


def run_grid_stop(sim: Sim, width_full: float, seed: Seed, rule: StopRule = StopRule(),
                  log: list | None = None) -> Outcome:
    """The user who runs the full planned grid, its observations in the order a scheduler finishes them (by the
    tokens on their path, the smaller sizes first), with curves and their off-grid rows, refitting after each wave
    of equal path tokens and stopping the trunks `stop_trunks` says cannot move D* (re-examined every wave: a
    resumed trunk's skipped decays are bought in the next wave). It ends when the grid is spent or stopped.
    ``log``: a list to fill with each wave's purchase and the trunks stopped then (`State.log`)."""
    draws = stop_rng(seed)
    state = State([], sim.fitter(), curves=True, offgrid=True, stopping=True, rule=rule,
                  log=[] if log is None else log)
    full = sim.dag.full
    order = sorted(sim.pool, key=lambda q: (path_tokens(q), q.coords.get("N", q.coords.get("N1")), q.segment))
    waves = sorted({path_tokens(q) for q in order})
    reached: Outcome | None = None
    errors = {"0.1": ERROR_CAP, "0.2": ERROR_CAP}
    for wave in waves:
        bought = set(state.bought)
        picked = [q for q in order if path_tokens(q) <= wave and q not in bought and q.trunk not in state.stopped]
        if not picked:
            continue
        state.spent += sim.cost(state.bought, picked)
        state.bought += picked
        state.log.append((tuple(q.segment for q in picked), frozenset(state.stopped)))
        sim.refit(state, set(LAW))
        for f in errors:
            if state.spent <= float(f) * full:
                errors[f] = sim.error(state)
        if reached is None and sim.width(state.bought, state) <= width_full * SLACK:
            reached = Outcome(state.spent / full, sim.covers(state), sim.covers_delta(state), dict(errors),
                              sim.at_truth(state.bought, state).predicted_share(), len(state.stopped))
        stop_trunks(sim, state, [q for q in sim.pool if q not in set(state.bought)], draws)
    total = state.spent / full
    if reached is None:
        reached = Outcome(1.0, sim.covers(state), sim.covers_delta(state), errors,
                          sim.at_truth(state.bought, state).predicted_share(), len(state.stopped))
    return Outcome(reached.fraction, reached.covered, reached.covered_delta, reached.error_at,
                   reached.predicted_share, reached.stopped, 1.0 - total, total)


def noise_seed(seed: int, truth: int, draw: int) -> Seed:
    """The seed of one ground truth's noise (and of its random choosers) in one draw; draw 0 keeps the seeds of the
    single-draw bench, so its figures stay comparable."""
    return seed * 1000 + truth if draw == 0 else [seed, truth, draw]


@cache
def grid_plan(budgets: tuple[float, ...] = BUDGETS) -> Plan:
    """`GRID` planned with ``budgets`` for D1, D2 and from scratch."""
    return plan(parse_spec({**GRID, "tokens": {"d1": list(budgets), "d2": list(budgets), "scratch": list(budgets)}}))


@dataclass(frozen=True)
class Case:
    """One ground truth observed under one noise draw: what every method is run on."""

    truth: tuple[dict, dict, float, str]
    index: int
    draw: int
    seed: Seed
    methods: tuple[str, ...] = METHODS
    until_width: bool = False  # stop each design where it reaches the full grid's width: no error figures
    budgets: tuple[float, ...] = BUDGETS  # the grid's D1, D2 and from-scratch budgets


@dataclass(frozen=True)
class CaseResult:
    outcomes: dict[str, Outcome]
    full_covered: bool
    full_covered_delta: bool
    line: str


def run_case(case: Case) -> CaseResult:
    p = grid_plan(case.budgets)
    target = float(max(s.observation.N1 for s in p.observations()))
    sim = Sim(p, case.truth, target, seed=case.seed, budgets=case.budgets)
    ref = State(list(sim.pool), Fitter())
    sim.refit(ref, set(LAW))
    width_full = sim.width(sim.pool)
    outcomes = {m: run_method(sim, m, width_full, seed=case.seed, until_width=case.until_width) for m in case.methods}
    line = "  ".join([f"truth {case.index + 1:2d} draw {case.draw} ({case.truth[3]:7s} D*={case.truth[2]:.3g}): "
                      f"full width {width_full:.3f}"]
                     + [f"{m} {o.fraction:.3f}{'' if o.covered else '!'}" for m, o in outcomes.items()])
    return CaseResult(outcomes, sim.covers(ref), sim.covers_delta(ref), line)


def coverage(covered: list[bool], truths: int) -> tuple[float, float]:
    """The share covered over truths x draws, and its standard error with each truth's draws as one cluster (a
    truth's draws share its laws, so they are not independent trials)."""
    per_truth = np.array(covered, float).reshape(-1, truths).mean(axis=0)  # cases are ordered draw-major
    se = float(per_truth.std(ddof=1) / math.sqrt(truths)) if truths > 1 else float("nan")
    return float(np.mean(covered)), se


def goals(fraction: dict[str, float], covered: dict[str, float]) -> dict[str, bool]:
    """The issues' goals, for the methods that ran: today's design within 0.30 of the full FLOPs and 0.6x the
    anchor's; the curve-aware ones (and grid_stop) within 0.08; all with coverage of at least 0.75."""
    out = {}
    anchors = [fraction[a] for a in ("anchor", "anchor_marginal") if a in fraction]
    if "upscale" in fraction:
        out["upscale_le_0.30"] = fraction["upscale"] <= 0.30
        if anchors:
            out["upscale_le_0.6x_anchor"] = fraction["upscale"] <= 0.6 * min(anchors)
        out["coverage_ge_0.75"] = covered["upscale"] >= 0.75
    for m in [*CURVE_METHODS, "grid_stop"]:
        if m in fraction:
            out[f"{m}_le_0.08"] = fraction[m] <= 0.08
            out[f"{m}_coverage_ge_0.75"] = covered[m] >= 0.75
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="seed of the ground-truth draws and the noise")
    ap.add_argument("--quick", action="store_true", help="3 ground truths (one per place of D*), one draw: a smoke run")
    ap.add_argument("--truths", type=int, default=None, help="ground truths (default 20, 3 with --quick)")
    ap.add_argument("--draws", type=int, default=None,
                    help="noise draws per ground truth (default 5, 1 with --quick): every figure is over truths x "
                         "draws; with one draw, coverage over 20 truths is only good to about +-0.09")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes running cases side by side")
    ap.add_argument("--json", type=str, default=None, help="also write the figures to this file")
    ap.add_argument("--methods", type=str, default=",".join(METHODS), help="comma-separated methods to run")
    ap.add_argument("--until-width", action="store_true",
                    help="stop each design where it reaches the full grid's width (fraction and coverage only, no "
                         "error figures): several times faster for the curve-aware designs")
    ap.add_argument("--budgets", type=lambda v: [float(x) for x in v.split(",")], default=list(BUDGETS),
                    help="the grid's D1, D2 and from-scratch budgets in tokens, comma-separated (default "
                         f"{','.join(f'{b:g}' for b in BUDGETS)}): the truths are drawn around them")
    args = ap.parse_args(argv)
    methods = tuple(args.methods.split(","))
    unknown = set(methods) - set(METHODS)
    if unknown:
        ap.error(f"unknown method(s) {sorted(unknown)}: choose from {', '.join(METHODS)}")
    n = args.truths or (3 if args.quick else 20)
    draws = args.draws or (1 if args.quick else 5)
    t0 = time.perf_counter()
    budgets = tuple(sorted(args.budgets))
    p = grid_plan(budgets)
    target = float(max(s.observation.N1 for s in p.observations()))
    truths = draw_truths(n, target, np.random.default_rng(args.seed), budgets)
    cases = [Case(truth, i, r, noise_seed(args.seed, i, r), methods, args.until_width, budgets) for r in range(draws)
             for i, truth in enumerate(truths)]
    with ProcessPoolExecutor(max_workers=max(1, min(args.workers, len(cases)))) as pool:
        results = []
        for result in pool.map(run_case, cases):
            print(result.line, file=sys.stderr, flush=True)
            results.append(result)
    per = {m: [r.outcomes[m] for r in results] for m in methods}
    covered = {**{m: [o.covered for o in per[m]] for m in methods}, "full_grid": [r.full_covered for r in results]}
    covered_delta = {**{m: [o.covered_delta for o in per[m]] for m in methods},
                     "full_grid": [r.full_covered_delta for r in results]}
    shares = {m: coverage(c, n) for m, c in covered.items()}
    curved = [m for m in methods if m in CURVE_METHODS or m == "grid_stop"]
    figures = {
        "fraction_of_full_flops": {m: float(np.median([o.fraction for o in per[m]])) for m in methods},
        "coverage_80": {m: share for m, (share, _) in shares.items()},
        "coverage_80_se": {m: se for m, (_, se) in shares.items()},
        "coverage_80_by_draw": {m: [float(np.mean(c[r * n:(r + 1) * n])) for r in range(draws)]
                                for m, c in covered.items()},
        "coverage_80_delta": {m: coverage(c, n)[0] for m, c in covered_delta.items()},
        "log10_dstar_error_at": None if args.until_width else {
            f: {m: float(np.median([o.error_at[f] for o in per[m]])) for m in methods} for f in ("0.1", "0.2")},
        "predicted_share": {m: float(np.nanmedian([o.predicted_share for o in per[m]])) for m in curved},
        "stopped_trunks": {m: float(np.mean([o.stopped for o in per[m]])) for m in curved},
        "stopped_flops": {m: float(np.median([o.stopped_flops for o in per[m]])) for m in curved},
        "grid_stop_spent": (float(np.median([o.spent_total for o in per["grid_stop"]]))
                            if "grid_stop" in per else None),
        "truths": n, "draws": draws, "seed": args.seed, "full_flops": p.total_flops, "pool": len(pool_of(p)),
        "target_n1": target, "seconds": round(time.perf_counter() - t0, 1),
    }
    figures["goals"] = goals(figures["fraction_of_full_flops"], figures["coverage_80"])
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)
    return figures


if __name__ == "__main__":
    main()
