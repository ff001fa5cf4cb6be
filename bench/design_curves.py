"""Loss curves for the active-design bench (bench/active_design.py): what every bought trunk piece and decay would
have logged, and the decay ends a family's curves predict (fitting/curve_observations.py, the one predictor).

The curves come from a law that is NOT the multi-power law the predictor fits, so the test is not circular, and they
agree with the ground truth where the truth is defined: a ground truth's law (Table 2's, perturbed) gives the loss at
the END of a decay, L_end(D) at the trunk's tokens D. At constant LR a trunk sits above that by a decay gain g(D) =
G0·(D/1e9)^−0.15 of log loss (a noise floor the decay removes, shrinking slowly with the budget); along a decay the
log loss is log L_end(D_t) + g(D_t)·(h(t) − h_end·u(t)), where h is the EMA of the LR multiplier (bench/curve_law.py's
noise-floor shape, time constant a quarter of the decay), mapped to 1 at the peak and 0 at the final LR, and u the
share of the decay done: the path relaxes like a noise floor and lands exactly on L_end at its end. Every point of
one trunk shares the trunk's draw (the one its observed decays carry); each curve point has its own N(0, 0.005).

Curves are in units of STEP optimiser steps (STEP x 512 x 1024 tokens), sampled at ~24 points a trunk piece and 16 a
decay, so a family's curve fits stay affordable; each family's predictions are cached on what its trunks have
bought, so nothing is refitted until new curve data arrive, and each trunk's fits are kept by their data, so new data
refit only the trunks they change, those borrowing decay parameters from a changed donor, and the pooled fits whose
family median they move.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache

import numpy as np
from curve_law import FINAL, wsd  # bench/curve_law.py: the schedule, as workers/schedule.py computes it
from threadpoolctl import threadpool_limits

from upscale.fitting.curve_law import Curve
from upscale.fitting.curve_observations import CurvePredictions, TrunkCurves, predict_decay_ends
from upscale.fitting.fit import FitOptions
from upscale.sweeps.planner import Plan

STEP = 8  # optimiser steps per curve step
PIECE_POINTS, DECAY_POINTS = 24, 16
GAIN_AT_1E9, GAIN_SLOPE = 0.03, 0.15  # g(D) = G0·(D/1e9)^−GAIN_SLOPE, G0 drawn around GAIN_AT_1E9 per truth
TRUNK_KINDS, DECAY_KINDS = ("moe_trunk", "scratch_trunk"), ("moe_decay", "scratch_decay")
FIT = FitOptions(n_starts=2)


@dataclass(frozen=True)
class Layout:
    """One trunk as the planner laid it out: its pieces (segment, start, end tokens) in order, its decays (segment ->
    branch and end tokens) and its family (the law its decays are observations of)."""

    trunk: str
    family: str
    pieces: tuple[tuple[str, int, int], ...]
    decays: Mapping[str, tuple[int, int]]

    def piece_reaching(self, tokens: int) -> tuple[str, int, int]:
        """The first piece that reaches ``tokens``: the one a branch there hangs from."""
        return next(piece for piece in self.pieces if piece[2] >= tokens)


@dataclass(frozen=True)
class Piece:
    """A planned segment as the curves need it: a bench's own plan (`plan_pieces`) or an exported one's."""

    id: str
    kind: str
    start: int
    end: int
    trunk: str


def plan_pieces(p: Plan) -> list[Piece]:
    return [Piece(s.id, s.spec.kind, s.spec.start_tokens, s.spec.end_tokens, s.trunk) for s in p.segments]


def layouts(segments: list[Piece]) -> dict[str, Layout]:
    out: dict[str, Layout] = {}
    by_trunk: dict[str, list[Piece]] = {}
    for s in segments:
        if s.kind in TRUNK_KINDS + DECAY_KINDS:
            by_trunk.setdefault(s.trunk, []).append(s)
    for trunk, segs in by_trunk.items():
        pieces = sorted((s.id, s.start, s.end) for s in segs if s.kind in TRUNK_KINDS)
        decays = {s.id: (s.start, s.end) for s in segs if s.kind in DECAY_KINDS}
        family = "up" if segs[0].kind.startswith("moe") else "moe"
        out[trunk] = Layout(trunk, family, tuple(sorted(pieces, key=lambda x: x[1])), decays)
    return out


def offgrid_ends(budgets: list[int], warmup: int) -> list[int]:
    """Off-grid decay ends a trained trunk's curve predicts besides the grid's (in curve steps): the geometric
    midpoints of consecutive budgets, and one between twice the warmup and the first budget."""
    anchors = [2 * warmup, *sorted(budgets)]
    return [round(math.sqrt(a * b)) for a, b in itertools.pairwise(anchors) if b > a]


def units(p: Plan, tokens: int) -> int:
    return round(tokens / (p.segments[0].spec.tokens_per_step * STEP))


@cache
def schedule(end: int, warmup: int, decay_start: int | None, shape: str) -> np.ndarray:
    """The LR multiplier of curve steps 1..end (one curve step a unit of the planner's schedule), computed once per
    schedule: `wsd` is a Python loop over the steps, and every refit asks for the same few schedules again."""
    return wsd(end, warmup, decay_start, shape)


class CurveSim:
    """Every curve of one ground truth's pool under one noise draw, and the family predictions from what is bought.

    ``end_loss(trunk, tokens)``: the truth's loss at the end of a decay at ``tokens`` on
    ``trunk`` (the law evaluated with the trunk's own coordinates); ``effect``: each trunk's shared draw of log loss;
    ``observed``: each decay's observed end loss (its curve's last point)."""

    def __init__(self, p: Plan, end_loss: Callable[[str, float], float], effect: Mapping[str, float],
                 observed: Mapping[str, float], gain: float, rng: np.random.Generator, noise: float) -> None:
        self.p = p
        self.layout = layouts(plan_pieces(p))
        self.unit = p.segments[0].spec.tokens_per_step * STEP  # tokens per curve step
        sched = p.segments[0].spec.schedule
        if sched.final_lr_fraction != FINAL:
            raise ValueError(f"the grid decays to {sched.final_lr_fraction} of the peak LR; the curves know {FINAL}")
        self.shape, self.final = sched.decay_shape, FINAL
        self.warmup = units(p, sched.warmup_tokens)
        self.family_of = {t: lay.family for t, lay in self.layout.items()}
        self.piece_curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.decay_curves: dict[str, Curve] = {}
        self.cache: dict[tuple, tuple[CurvePredictions, dict[str, float]]] = {}
        self.fits: dict[str, dict[str, float] | None] = {}  # per-trunk curve fits by their data (predict_decay_ends)

        self.gain = gain
        for t, lay in self.layout.items():
            for sid, start, end in lay.pieces:
                at = np.unique(np.linspace(max(units(p, start), self.warmup) + 1, units(p, end), PIECE_POINTS)
                               .round().astype(int))
                tokens = at * self.unit
                log_loss = np.log([end_loss(t, float(d)) for d in tokens]) + self.g(tokens)
                self.piece_curves[sid] = (at, np.exp(log_loss + effect[t] + rng.normal(0, noise, at.size)))
            for sid, (start, end) in lay.decays.items():
                self.decay_curves[sid] = self.decay_curve(t, units(p, start), units(p, end), observed[sid],
                                                          end_loss, effect[t], rng, noise)
        self.offgrid = self.offgrid_decays(sched.decay_fraction)

    def g(self, tokens: np.ndarray) -> np.ndarray:
        """The decay gain at constant LR, of log loss: how far a trunk sits above its decay ends at ``tokens``."""
        return self.gain * (tokens / 1e9) ** -GAIN_SLOPE

    def decay_curve(self, trunk: str, s0: int, s1: int, end: float, end_loss: Callable[[str, float], float],
                    effect: float, rng: np.random.Generator, noise: float) -> Curve:
        """The curve a decay from curve step ``s0`` to ``s1`` on ``trunk`` logs, ending on its observation ``end``."""
        lr = self.lr(s1, s0)
        ema, m = np.empty(s1 - s0), 1.0
        tau = max((s1 - s0) / 4, 1.0)
        for i, eta in enumerate(lr[s0:]):
            m += (eta - m) / tau
            ema[i] = m
        h = (ema - self.final) / (1 - self.final)
        u = np.arange(1, s1 - s0 + 1) / (s1 - s0)
        at = np.unique(np.linspace(s0 + 1, s1, DECAY_POINTS).round().astype(int))
        idx = at - s0 - 1
        tokens = at * self.unit
        log_loss = np.log([end_loss(trunk, float(d)) for d in tokens]) + self.g(tokens) * (h[idx] - h[-1] * u[idx])
        loss = np.exp(log_loss + effect + rng.normal(0, noise, at.size))
        loss[-1] = end  # the decay's end is the observation itself
        return Curve(lr, at, loss)

    def add_offgrid_curves(self, observed: Mapping[str, float], end_loss: Callable[[str, float], float],
                           effect: Mapping[str, float], rng: np.random.Generator, noise: float) -> None:
        """The curves the off-grid decays would log if bought (each ending on its ``observed`` loss), drawn from a
        stream of their own so that the grid's curves stay those of a design that cannot buy them."""
        for t, decays in self.offgrid.items():
            for key, s0, s1 in decays:
                self.decay_curves[key] = self.decay_curve(t, s0, s1, observed[key], end_loss, effect[t], rng, noise)

    def offgrid_decays(self, fraction: float) -> dict[str, list[tuple[str, int, int]]]:
        """Each trunk's off-grid decays (key, branch step, end step): `offgrid_ends` of its grid's budgets, each
        decaying over its last ``fraction`` as the planner's decays do."""
        out = {}
        for t, lay in self.layout.items():
            ends = offgrid_ends(sorted({round(e / self.unit) for _, e in lay.decays.values()}), self.warmup)
            out[t] = [(f"{t}@{e * self.unit}", round(e * (1 - fraction)), e) for e in ends]
        return out

    def offgrid_tokens(self, key: str) -> int:
        """The decay end, in tokens, of an off-grid key."""
        return int(key.rsplit("@", 1)[1])

    def lr(self, end: int, decay_start: int | None) -> np.ndarray:
        return schedule(end, self.warmup, decay_start, self.shape)

    def offgrid_lr(self, trunk: str, key: str) -> np.ndarray:
        _, branch, end = next(x for x in self.offgrid[trunk] if x[0] == key)
        return self.lr(end, branch)

    def reach(self, trunk: str, segments: set[str]) -> int:
        """How far, in tokens, the bought ``segments`` have trained ``trunk`` (0: not at all): the end of its last
        bought piece, or the branch point of a bought decay (a grid decay's needs its whole piece, an off-grid one's
        only the part up to where it branches)."""
        lay = self.layout[trunk]
        ends = [end for sid, _, end in lay.pieces if sid in segments]
        ends += [lay.piece_reaching(lay.decays[d][0])[2] for d in lay.decays if d in segments]
        ends += [b * self.unit for k, b, _ in self.offgrid[trunk] if k in segments]
        return max(ends, default=0)

    def trained(self, trunk: str, segments: set[str]) -> int:
        """How many of ``trunk``'s pieces the bought ``segments`` (pieces and decays) have trained whole."""
        reach = self.reach(trunk, segments)
        return sum(end <= reach for _, _, end in self.layout[trunk].pieces)

    def predictable(self, trunk: str, reach: int, offgrid: bool = False) -> list[str]:
        """The decays of ``trunk`` whose branch point lies on its first ``reach`` tokens (with ``offgrid``, its
        off-grid decays there too: keys `offgrid_decays` names)."""
        lay = self.layout[trunk]
        out = [d for d, (b, _) in lay.decays.items() if b <= reach]
        return out + [k for k, b, _ in self.offgrid[trunk] if b * self.unit <= reach] if offgrid else out

    def predictions(self, family: str, segments: set[str]) -> tuple[CurvePredictions | None, dict[str, float]]:
        """The family's predicted end of every unobserved decay on its trained parts (segment -> loss; off-grid
        decays by their keys), and the predictions' record (None when no trunk of the family is trained), from what
        ``segments`` bought."""
        key_parts, trunks, wanted, ids = self.family_trunks(family, segments)
        if not trunks:
            return None, {}
        key = (family, tuple(key_parts))
        if key not in self.cache:
            with threadpool_limits(1):  # L-BFGS-B runs ~10x slower with BLAS threads fighting over 2 busy cores
                pred = predict_decay_ends(trunks, wanted, FIT, self.fits)
            losses = {d: float(v) for d, v in zip(ids, pred.losses, strict=True)
                      if pred.usable and math.isfinite(v) and v > 0}
            self.cache[key] = (pred, losses)
        return self.cache[key]

    def family_trunks(self, family: str, segments: set[str]) -> tuple[list, list[TrunkCurves], list, list[str]]:
        """What ``segments`` bought of the family as the predictions read it: a cache key part per trained trunk,
        its curves (`TrunkCurves`), the decays to predict (trunk, LR schedule) and their segments or keys."""
        key_parts, trunks, wanted, ids = [], [], [], []
        for t, lay in self.layout.items():
            if lay.family != family:
                continue
            reach = self.reach(t, segments)
            if not reach:
                continue
            decays = tuple(sorted(d for d in [*lay.decays, *(k for k, _, _ in self.offgrid[t])] if d in segments))
            key_parts.append((t, reach, decays))
            parts = []
            for sid, start, end in lay.pieces:
                if start < reach:  # a piece trained whole, or the part of one up to an off-grid decay's branch
                    a, v = self.piece_curves[sid]
                    keep = a * self.unit <= reach if end > reach else slice(None)
                    parts.append((a[keep], v[keep]))
            at, loss = np.concatenate([a for a, _ in parts]), np.concatenate([v for _, v in parts])
            curve = Curve(self.lr(int(at[-1]), None), at, loss)
            trunks.append(TrunkCurves(t, curve, tuple(self.decay_curves[d] for d in decays), family, family))
            for d in self.predictable(t, reach, offgrid=True):
                if d not in segments:
                    wanted.append((t, self.decay_curves[d].lr if d in lay.decays else self.offgrid_lr(t, d)))
                    ids.append(d)
        return key_parts, trunks, wanted, ids
