"""Cross-family coverage of D* intervals, measured: runs drawn from laws upscale does NOT fit, the user's analysis on
them, and how often its 80% and 95% D* intervals hold the true crossing. A simulation: nothing trains.

upscale fits Chinchilla (E + A·D^−α + B·N^−β) to the dense and from-scratch runs and the paper's joint law
(E + A·D1^−α1·D2^(−α2 + α3·ln D1) + B·N1^−β) to the upcycled ones (fitting/laws.py). bench/calibration.py measures the
intervals when the runs follow exactly those laws; a researcher's runs follow some other law, and then the intervals,
which carry only the bootstrap's parameter noise, may miss. The truths here are four such realities, each plausible:

- ``effective`` (effective tokens): upcycling is from-scratch training with a head start worth k(N1)·D1^g tokens of
  from-scratch training (dense tokens count, at a decaying rate g < 1), plus a small MoE-conversion penalty
  P·(D2/D_mid)^−c that fades with D2 more slowly than the head start's worth does (c < α), so from scratch overtakes:
  L_up = L_scratch(D2 + κ·D_mid·(D1/D_mid)^g·(N1/N_mid)^h, N1) + P·(D2/D_mid)^−c.
- ``curved`` (a bending power law, for every arm): the data term of each law is A·exp(−a·x − c·x²/2) with
  x = ln(D/D_mid), an exponent a + c·x that bends smoothly with the budget (steeper or flatter, both signs); the
  upcycled one bends in D1 and D2 separately with no D1·D2 interaction: E + A_u·exp(−a1·x1 − a2·x2 − (c1·x1² +
  c2·x2²)/2) + B·N1^−β, its size term equal to from scratch's at the reference N1.
- ``transfer-exp`` (saturating transfer, fading exponentially): upcycling keeps a share G of from scratch's data
  term A·(D2/D_mid)^−α off, G saturating in D1 (G = g·D1^q/(D1^q + d_h^q)·(N1/N_mid)^h), and that share fades as
  exp(−D2/τ(D1)), τ growing with D1; the upcycled model ends δ above from scratch (a worse asymptote):
  L_up = L_scratch(D2, N1) + δ − G(D1, N1)·exp(−D2/τ(D1))·A·(D2/D_mid)^−α.
- ``transfer-ratio``: the same with the head start fading as a power of D2/D1, (1 + D2/(s·D1))^−p.

Dense and from-scratch runs follow Chinchilla (``curved``: the bending law), one E for all three arms as upscale
assumes. Every law is anchored at the grid's middle (D_mid, N_mid), so each scale is the term's size there. Each
draw's one free scale (P, A_u or δ: the loss at which upcycling's edge is used up) is solved so that the true D* at the
reference N1 (the grid's largest) lies at a placement times the grid's largest budget: 0.3x (inside), 1x (the edge),
3x, 10x, 30x (outside). A draw is kept only if every arm's loss falls with every budget over the searched range and
the first crossing where upcycling stops winning, found by root finding on the truth over the range the analysis
searches, is the placed one; ``true_dstar`` is that root finding.

Observations: the demo's grid (bench/calibration.py's ``tiny``: 3 sizes, 4 budgets 4x apart, dense and from scratch
per (D, N), upcycled per D1 x D2 x N1, trunks as the planner makes them) drawn by fitting/synthetic.py's ``generate``:
point noise and a trunk effect (one draw shared by every branch of one WSD trunk), each σ from {0.3%, 0.5%, 1%}.
Every case then runs the user's path, ``analyze(tables, n1s=[N1], bootstrap=B, seed=...)``, and reads its D* interval
at the reference N1 through ``reported_interval`` (the one place that knows which record field is the interval).

Figures per family and placement, per family, per placement and overall: ``coverage_80`` / ``coverage_95`` (an open
end is unbounded; a case without a D* record is not covered), the median width in decades of the bounded intervals
and how many were open, and for the truths in the grid (placement <= 1x: D* at most the largest budget trained)
``bounded_decade_80``, the share of 80% intervals bounded and at most a decade wide, and the same among the
truths the runs could bound one budget past the grid (``resolvable``: the true mean gap at 4x the largest budget
beyond the matched pairs' noise threshold). Each case also keeps the reported interval's parts (the calibrated
bands, the forms' bootstrap mixture, the runs' bracket) and whether each alone held the truth, so a coverage off
its nominal level can be traced to the part that causes it. The paper's own family, in the
grid, is run beside them (bench/calibration.py's truths and tables, ``--paper`` of them). Goals: 80%
coverage >= 0.75, 95% >= 0.9, and every in-grid 80% interval bounded and at most a decade wide.

    nice -n 10 .venv/bin/python bench/cross_family.py [--cases N] [--paper M] [--bootstrap B] [--seed S]
        [--workers W] [--json OUT] [--from-json OUT...]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from calibration import (  # bench/calibration.py: the paper family's truths, the grid, the scoring helpers
    GRIDS,
    NOISES,
    Truth,
    draw_truth,
    interval_bounds,
    json_interval,
    share,
)
from calibration import tables as paper_tables
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from scipy.optimize import brentq

from upscale.fitting.analysis import analyze
from upscale.fitting.dstar import SEARCH_FACTOR
from upscale.fitting.laws import get_law
from upscale.fitting.observed import observe
from upscale.fitting.synthetic import design, generate

GRID = GRIDS["tiny"]
D_MIN, D_MAX = float(min(GRID["D1"])), float(max(GRID["D1"]))
D_MID, N_MID = math.sqrt(D_MIN * D_MAX), float(np.median(GRID["N1"]))
N1_REF = float(max(GRID["N1"]))  # where D* is placed and read
SPAN = (D_MIN / SEARCH_FACTOR, D_MAX * SEARCH_FACTOR)  # the range the analysis searches D* in, and the truth's
PLACEMENTS = (0.3, 1.0, 3.0, 10.0, 30.0)  # true D* / the grid's largest budget
FAMILIES = ("effective", "curved", "transfer-exp", "transfer-ratio")
PAPER = "paper"  # the paper's own family (bench/calibration.py), in the grid
LEVELS = ("80", "95")
PARTS = ("band", "mixture", "bracket")  # the reported interval's parts, each scored alone too
NEXT_BUDGET = 4.0  # the grid's budgets step 4x: the budget a researcher would add next is 4x its largest
DRAWS = 200  # draws per case before giving up on finding a valid truth
_SCAN = 2000  # log-grid points of the truth's gap over SPAN (the sign changes brentq refines)


# ---------------------------------------------------------------------------------------------------------- the laws

def _data_term(p: dict[str, float], arm: str, d: np.ndarray) -> np.ndarray:
    """A·exp(−a·x − c·x²/2), x = ln(d/D_mid): the data term of an arm ("d" dense, "s" from scratch); c = 0 is
    Chinchilla's A·(d/D_mid)^−a."""
    x = np.log(np.asarray(d, float) / D_MID)
    return p[arm + "A"] * np.exp(-p[arm + "a"] * x - p.get(arm + "c", 0.0) * x * x / 2)


def _size_term(p: dict[str, float], arm: str, n: np.ndarray) -> np.ndarray:
    return p[arm + "B"] * (np.asarray(n, float) / N_MID) ** -p[arm + "b"]


def arm_loss(p: dict[str, float], arm: str, d: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Dense ("d") or from-scratch ("s") loss at (D, N)."""
    return p["E"] + _data_term(p, arm, d) + _size_term(p, arm, n)


def _share_kept(p: dict[str, float], family: str, d1: np.ndarray, d2: np.ndarray, n1: np.ndarray) -> np.ndarray:
    """transfer-*: G(D1, N1) times its fade in D2, the share of from scratch's data term upcycling keeps off."""
    g = p["g"] * d1 ** p["q"] / (d1 ** p["q"] + p["dh"] ** p["q"]) * (n1 / N_MID) ** p["h"]
    if family == "transfer-exp":
        return g * np.exp(-d2 / (p["tau"] * D_MID * (d1 / D_MID) ** p["pw"]))
    return g * (1 + d2 / (p["s"] * d1)) ** -p["pw"]


def upcycled_loss(p: dict[str, float], family: str, d1: np.ndarray, d2: np.ndarray, n1: np.ndarray) -> np.ndarray:
    """The upcycled loss at (D1, D2, N1) in ``family`` (the module docstring's formulas)."""
    d1, d2, n1 = (np.asarray(v, float) for v in (d1, d2, n1))
    if family == "effective":
        head = p["kappa"] * D_MID * (d1 / D_MID) ** p["g"] * (n1 / N_MID) ** p["h"]
        return arm_loss(p, "s", d2 + head, n1) + p["P"] * (d2 / D_MID) ** -p["c"]
    if family == "curved":
        x1, x2 = np.log(d1 / D_MID), np.log(d2 / D_MID)
        data = p["uA"] * np.exp(-p["a1"] * x1 - p["a2"] * x2 - (p["c1"] * x1 * x1 + p["c2"] * x2 * x2) / 2)
        size = _size_term(p, "s", N1_REF) * (n1 / N1_REF) ** -p["ub"]
        return p["E"] + data + size
    return arm_loss(p, "s", d2, n1) + p["delta"] - _data_term(p, "s", d2) * _share_kept(p, family, d1, d2, n1)


def gap(p: dict[str, float], family: str, d: np.ndarray, n1: float = N1_REF) -> np.ndarray:
    """L_scratch(D, N1) − L_up(D, D, N1): positive where upcycling wins (Eq. 13's path)."""
    d = np.asarray(d, float)
    n = np.full(d.shape, n1)
    return arm_loss(p, "s", d, n) - upcycled_loss(p, family, d, d, n)


def log_gap(p: dict[str, float], family: str, d: np.ndarray, n1: float = N1_REF) -> np.ndarray:
    """log L_scratch(D, N1) − log L_up(D, D, N1): ``gap`` in the log losses the runs' noise is measured in."""
    d = np.asarray(d, float)
    n = np.full(d.shape, n1)
    return np.log(arm_loss(p, "s", d, n)) - np.log(upcycled_loss(p, family, d, d, n))


class TruthLaw:
    """One arm of a truth as fitting/synthetic.py's ``generate`` reads a law: ``predict(params, table)``."""

    def __init__(self, family: str, kind: str) -> None:
        self.family, self.kind = family, kind

    def predict(self, params: dict[str, float], table: pd.DataFrame | Mapping[str, np.ndarray]) -> np.ndarray:
        if self.kind == "upcycled":
            return upcycled_loss(params, self.family, table["D1"], table["D2"], table["N1"])
        return arm_loss(params, "d" if self.kind == "dense" else "s", table["D"], table["N"])


# -------------------------------------------------------------------------------------------------------- the truths

def true_dstar(p: dict[str, float], family: str, n1: float = N1_REF, span: tuple[float, float] = SPAN) -> float:
    """The truth's D*: the first crossing over ``span`` where upcycling stops winning (gap from > 0 to < 0 as D
    grows; a crossing where upcycling starts winning is not D*, as in fitting/dstar.py), refined by brentq; inf
    when there is none."""
    x = np.linspace(*np.log(span), _SCAN)
    g = gap(p, family, np.exp(x), n1)
    down = np.flatnonzero((g[:-1] > 0) & (g[1:] <= 0))
    if not down.size:
        return math.inf
    i = down[0]
    if g[i + 1] == 0:
        return float(np.exp(x[i + 1]))
    return float(np.exp(brentq(lambda v: gap(p, family, np.exp([v]), n1)[0], x[i], x[i + 1], xtol=1e-13)))


def _draw_common(rng: np.random.Generator, family: str) -> dict[str, float]:
    """E, dense and from-scratch: the data terms 1-2 at D_mid, the size terms 0.5-1.5 at N_mid."""
    p = {"E": rng.uniform(1.6, 2.4),
         "dA": rng.uniform(1.0, 2.0), "da": rng.uniform(0.2, 0.35), "dB": rng.uniform(0.6, 1.5),
         "db": rng.uniform(0.25, 0.45),
         "sA": rng.uniform(1.0, 2.0), "sa": rng.uniform(0.25, 0.4), "sB": rng.uniform(0.5, 1.2),
         "sb": rng.uniform(0.25, 0.45)}
    if family == "curved":
        p |= {"dc": rng.uniform(-0.025, 0.025), "sc": rng.uniform(-0.025, 0.025)}
    return p


def _draw_upcycled(rng: np.random.Generator, family: str, p: dict[str, float], dstar: float) -> dict[str, float]:
    """The upcycled law's shape, then its free scale solved so that gap(D*) = 0 at the reference N1."""
    if family == "effective":
        p |= {"kappa": 10 ** rng.uniform(-0.5, 0), "g": rng.uniform(0.6, 0.9), "h": rng.uniform(0, 0.5),
              "c": rng.uniform(0.05, min(0.2, p["sa"] - 0.05))}
    elif family == "curved":
        path = p["sa"] * rng.uniform(0.5, 0.85)  # the upcycled law's slope along D1 = D2: from scratch catches up
        a1 = path * rng.uniform(0.3, 0.5)
        p |= {"a1": a1, "a2": path - a1, "c1": rng.uniform(-0.015, 0.015), "c2": rng.uniform(-0.015, 0.015),
              "ub": p["sb"] * rng.uniform(0.9, 1.1)}
    else:
        p |= {"g": rng.uniform(0.2, 0.4), "q": rng.uniform(0.5, 1.0), "h": rng.uniform(0, 0.3),
              "dh": dstar * 10 ** rng.uniform(-3, -1.5)}
        if family == "transfer-exp":
            pw, r = rng.uniform(0.3, 0.7), rng.uniform(1, 3)  # τ(D*) = D*/r: the share fades by e^−r at D*
            p |= {"pw": pw, "tau": dstar / r / (D_MID * (dstar / D_MID) ** pw)}
        else:
            p |= {"s": 10 ** rng.uniform(-0.5, 0.5), "pw": rng.uniform(0.3, 1.0)}
    return place(p, family, dstar)


SCALE = {"effective": "P", "curved": "uA", "transfer-exp": "delta", "transfer-ratio": "delta"}  # each free scale


def place(p: dict[str, float], family: str, dstar: float) -> dict[str, float]:
    """``p`` with the family's free scale (SCALE) solved so that the gap is zero at ``dstar`` at the reference N1:
    the conversion penalty P that uses up the head start's worth there, the upcycled data term's size uA that meets
    from scratch's there, or the asymptote's excess delta that upcycling's kept share pays off there."""
    one, n = np.array([dstar]), np.array([N1_REF])
    p = dict(p)
    if family == "effective":
        p["P"] = 0.0
        p["P"] = gap(p, family, one)[0] / (dstar / D_MID) ** -p["c"]
    elif family == "curved":
        p["uA"] = 1.0
        unit = upcycled_loss(p, family, one, one, n)[0] - p["E"] - _size_term(p, "s", N1_REF)
        p["uA"] = _data_term(p, "s", one)[0] / unit
    else:
        p["delta"] = 0.0
        p["delta"] = gap(p, family, one)[0]
    return p


def monotone_checks(budgets: int) -> tuple[np.ndarray, ...]:
    """Where ``falling_curves`` evaluates a truth, ``budgets`` log-spaced budgets over the searched range per curve,
    one row per curve: dense's and from scratch's (D, N) at each size of the grid, and the upcycled (D1, D2, N1)
    along D1 = D2, in D2 at each trained D1 and in D1 at each trained D2 (where a faded head start leaves it flat)."""
    d = np.geomspace(*SPAN, budgets)
    sizes = np.array(GRID["N1"], float)
    paths = [(d, d)] + [(np.full_like(d, t), d) for t in GRID["D1"]] + [(d, np.full_like(d, t)) for t in GRID["D1"]]
    return (np.tile(d, (len(sizes), 1)), np.repeat(sizes[:, None], budgets, axis=1),
            np.array([d1 for _ in sizes for d1, _ in paths]), np.array([d2 for _ in sizes for _, d2 in paths]),
            np.repeat(sizes, len(paths))[:, None] * np.ones(budgets))


def falling_curves(p: dict[str, float], family: str, checks: tuple[np.ndarray, ...]) -> np.ndarray:
    """The truth's loss on every curve of ``checks`` (``monotone_checks``), one row per curve."""
    arm_d, arm_n, d1, d2, n1 = checks
    return np.concatenate([arm_loss(p, "d", arm_d, arm_n), arm_loss(p, "s", arm_d, arm_n),
                           upcycled_loss(p, family, d1, d2, n1)])


_FALL_CHECKS = monotone_checks(400)


def _falls(p: dict[str, float], family: str) -> bool:
    """No arm's loss rises with any budget over the searched range, at any size of the grid (a truth whose loss rises
    with training is no researcher's reality), and none falls to E (``monotone_checks`` names the curves)."""
    curves = falling_curves(p, family, _FALL_CHECKS)
    return bool(np.all(np.diff(curves, axis=1) <= 0) and np.all(curves > p["E"]))


@dataclass
class Case:
    index: int
    family: str  # one of FAMILIES, or PAPER
    placement: float | None  # true D* / the grid's largest budget as placed (None: the paper family's own draw)
    seed: int  # of the noise; the analysis's seed too
    noise: float
    trunk_noise: float
    params: dict[str, float]  # the truth (empty for the paper family: see ``paper``)
    n1: float
    dstar: float  # the true D* at n1, by root finding on the truth
    draws: int = 1  # draws it took to find a valid truth
    paper: Truth | None = None  # the paper family's truth, as bench/calibration.py draws it

    @property
    def in_grid(self) -> bool:
        """D* at most the largest budget trained (placements 0.3x and 1x): where the goal wants a tight interval."""
        return self.dstar <= D_MAX * (1 + 1e-9)


def draw_case(index: int, family: str, placement: float, seed: int) -> Case:
    """A valid truth of ``family`` whose D* at N1_REF lies at ``placement`` x the largest budget (module docstring)."""
    rng = np.random.default_rng([seed, index, FAMILIES.index(family)])
    target = placement * D_MAX
    noise, trunk_noise = (float(rng.choice(NOISES)) for _ in range(2))
    for draw in range(1, DRAWS + 1):
        p = _draw_upcycled(rng, family, _draw_common(rng, family), target)
        dstar = true_dstar(p, family)
        if _falls(p, family) and math.isclose(dstar, target, rel_tol=1e-6):
            return Case(index, family, placement, int(rng.integers(2**31)), noise, trunk_noise,
                        {name: float(v) for name, v in p.items()}, N1_REF, dstar, draw)
    raise RuntimeError(f"no valid {family} truth with D* at {placement}x the largest budget in {DRAWS} draws "
                       f"(seed {seed}, case {index}): widen the family's parameter ranges in _draw_upcycled")


def paper_case(index: int, seed: int) -> Case:
    """bench/calibration.py's truth of the paper's family with D* inside the demo's grid."""
    t = draw_truth(index, "inside", "tiny", seed)
    return Case(index, PAPER, None, t.seed, t.noise, t.trunk_noise, {}, t.n1, float(t.dstar), paper=t)


def tables(case: Case, law: Callable[[str, str], TruthLaw] = TruthLaw) -> dict[str, pd.DataFrame]:
    """The three observation tables of ``case`` on the demo's grid, one noise seed per table; ``law(family, kind)``
    predicts each (bench/twin_truths.py passes a truth bent past the grid)."""
    if case.paper is not None:
        return paper_tables(case.paper)
    chin = design(get_law("chinchilla"), {"D": GRID["D"], "N": GRID["N"]})
    up = design(get_law("joint"), {"D1": GRID["D1"], "D2": GRID["D2"], "N1": GRID["N1"]})
    return {kind: generate(law(case.family, kind), case.params, up if kind == "upcycled" else chin, case.noise,
                           case.trunk_noise, case.seed + i)
            for i, kind in enumerate(("dense", "scratch", "upcycled"))}


def cases(n: int, paper: int, seed: int, placements: Sequence[float] = PLACEMENTS) -> list[Case]:
    """``n`` cases spread over FAMILIES x PLACEMENTS (family fastest, then placement, then repeats: a run cut short
    has all of them), those at ``placements`` kept (each case the same truth as in the whole run), then ``paper`` of
    the paper's family."""
    combos = [(f, pl) for pl in PLACEMENTS for f in FAMILIES]
    out = [draw_case(i, *combos[i % len(combos)], seed) for i in range(n) if combos[i % len(combos)][1] in placements]
    return out + [paper_case(n + j, seed) for j in range(paper)]


# ----------------------------------------------------------------------------------------------------------- scoring

def reported_interval(result: dict[str, Any] | None, level: str) -> tuple[float, float] | None:
    """The D* interval at ``level`` ("80" or "95") that the analysis reports in one D* result of its record
    (``analysis.upcycled[i].dstar["results"][j]``) as numbers, an open end unbounded; None where there is none. The
    one place that knows which field holds the interval."""
    if result is None:
        return None
    return interval_bounds((result.get("intervals") or {}).get(level))


def width_decades(iv: tuple[float, float] | None) -> float | None:
    """log10(high / low) of a bounded interval; None for an open (or missing) one."""
    if iv is None or not (iv[0] > 0 and math.isfinite(iv[1])):
        return None
    return math.log10(iv[1] / iv[0])


def score(case: Case, result: dict[str, Any] | None) -> dict[str, Any]:
    """One case's outcome: the reported D* and, per level, its interval, whether it holds the true D*, whether it
    is bounded and its width in decades. ``result`` None: the analysis gave no D* (no fit), not covered."""
    row: dict[str, Any] = {"case": case.index, "family": case.family, "placement": case.placement,
                           "true_dstar": case.dstar, "in_grid": case.in_grid, "noise": case.noise,
                           "trunk_noise": case.trunk_noise, "result": result is not None,
                           "dstar": None if result is None else result.get("dstar"),
                           "state": None if result is None else result.get("dstar_state")}
    for level in LEVELS:
        iv = reported_interval(result, level)
        row[f"interval_{level}"] = json_interval(iv)
        row[f"covered_{level}"] = iv is not None and iv[0] <= case.dstar <= iv[1]
        row[f"bounded_{level}"] = width_decades(iv) is not None
        row[f"width_{level}"] = width_decades(iv)
        row[f"parts_{level}"] = _parts(case, result, level)
    return row


def _parts(case: Case, result: dict[str, Any] | None, level: str) -> dict[str, Any]:
    """The reported interval's parts at ``level`` (docs/laws.md, "The answer beyond one law"): where the calibrated
    bands separate, the weighed forms' bootstrap mixture, and the runs' bracket, each with whether it holds the
    truth; so an over- or under-coverage can be traced to the part that causes it."""
    answer = (result or {}).get("answer")
    if answer is None:
        return {}
    bracket = (answer.get("interval_brackets") or {}).get(level) or answer.get("observed_bracket")
    found = {"band": (answer.get("band_intervals") or {}).get(level),
             "mixture": (answer.get("mixture_intervals") or {}).get(level),
             "bracket": None if bracket is None else {"low": bracket.get("low"), "high": bracket.get("high")}}
    out: dict[str, Any] = {}
    for name, iv in found.items():
        bounds = interval_bounds(iv)
        out[name] = None if bounds is None else {"interval": json_interval(bounds),
                                                 "covered": bounds[0] <= case.dstar <= bounds[1]}
    return out


def resolvable(case: Case) -> bool | None:
    """Could the runs themselves bound D* from above one budget past the grid? True where the truth's mean log gap
    (upcycled against from scratch on the diagonal at the reference N1) at NEXT_BUDGET x the largest budget is
    beyond the noise threshold the analysis reads its matched pairs with (fitting/observed.py, on this case's own
    tables). Where it is not, a bounded interval within a decade would rest on the law's form alone, finer than
    the runs' noise. None for the paper's family (its truth is another module's)."""
    if case.paper is not None:
        return None
    true_gap = log_gap(case.params, case.family, np.array([NEXT_BUDGET * D_MAX]), case.n1)[0]
    t = tables(case)
    return bool(abs(true_gap) > observe(t["scratch"], t["upcycled"]).noise["gap_threshold"])


def run_case(args: tuple[Case, int]) -> dict[str, Any]:
    """The user's path on one case: ``analyze`` on its tables, scored at its N1 (a raise is an outcome: no D*)."""
    case, bootstrap = args
    t0 = time.perf_counter()
    try:
        a = analyze(tables(case), n1s=[case.n1], bootstrap=bootstrap, seed=case.seed)
        star = a.upcycled[0].dstar if a.upcycled else None
        row = score(case, star["results"][0] if star else None)
    except Exception as e:  # the user's path raising is an outcome to count, not a crash
        row = {**score(case, None), "error": f"{type(e).__name__}: {e}"}
    return {**row, "resolvable": resolvable(case), "seconds": round(time.perf_counter() - t0, 2)}


# ----------------------------------------------------------------------------------------------------------- figures

def figures(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Coverage (with its standard error), median width of the bounded intervals and open ones per level, and for
    the in-grid truths the share of 80% intervals bounded and at most a decade wide."""
    out: dict[str, Any] = {"n": len(rows)}
    for level in LEVELS:
        cov, se, _ = share([r[f"covered_{level}"] for r in rows])
        widths = [r[f"width_{level}"] for r in rows if r[f"width_{level}"] is not None]
        out |= {f"coverage_{level}": cov, f"coverage_{level}_se": se,
                f"median_width_{level}": float(np.median(widths)) if widths else None,
                f"open_{level}": sum(not r[f"bounded_{level}"] for r in rows)}
    inside = [r for r in rows if r["in_grid"]]
    out["in_grid"] = len(inside)
    out["bounded_decade_80"] = share([r["bounded_80"] and r["width_80"] <= 1 for r in inside])[0]
    clear = [r for r in inside if r.get("resolvable")]
    out["resolvable"] = len(clear)
    out["bounded_decade_80_resolvable"] = share([r["bounded_80"] and r["width_80"] <= 1 for r in clear])[0] \
        if clear else None
    out["no_result"] = sum(not r["result"] for r in rows)
    for level in LEVELS:  # each part of the reported interval alone (rows saved before the parts were kept: none)
        for part in PARTS:
            held = [r[f"parts_{level}"][part]["covered"] for r in rows if (r.get(f"parts_{level}") or {}).get(part)]
            out[f"{part}_coverage_{level}"] = share(held)[0] if held else None
            out[f"{part}_n_{level}"] = len(held)
    return out


def groups(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The figures per family x placement, per family, per placement, of every cross-family case, and of the
    paper's family."""
    cross = [r for r in rows if r["family"] != PAPER]
    out: dict[str, dict[str, Any]] = {}
    for f in FAMILIES:
        for pl in PLACEMENTS:
            if sel := [r for r in cross if r["family"] == f and r["placement"] == pl]:
                out[f"{f} {pl:g}x"] = figures(sel)
    for f in FAMILIES:
        if sel := [r for r in cross if r["family"] == f]:
            out[f"{f} (all)"] = figures(sel)
    for pl in PLACEMENTS:
        if sel := [r for r in cross if r["placement"] == pl]:
            out[f"all families {pl:g}x"] = figures(sel)
    if cross:
        out["cross-family (all)"] = figures(cross)
    if paper := [r for r in rows if r["family"] == PAPER]:
        out["paper family, in grid"] = figures(paper)
    return out


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.0f}%"


def table(by_group: dict[str, dict[str, Any]]) -> str:
    """The figures as a markdown table."""
    head = ("truths", "n", "cov 80%", "cov 95%", "median width 80% (dec.)", "open 80%", "median width 95% (dec.)",
            "open 95%", "in grid: 80% bounded, ≤ 1 dec.", "… where the runs could bound it")
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] + ["---:"] * (len(head) - 1)) + " |"]
    for name, f in by_group.items():
        cells = [name, str(f["n"])]
        for level in LEVELS:
            cov = f[f"coverage_{level}"]
            cells.append("—" if cov is None else f"{_pct(cov)} ± {_pct(f[f'coverage_{level}_se'])}")
        for level in LEVELS:
            w = f[f"median_width_{level}"]
            cells += ["—" if w is None else f"{w:.2f}", str(f[f"open_{level}"])]
        cells.append("—" if not f["in_grid"] else f"{_pct(f['bounded_decade_80'])} ({f['in_grid']})")
        cells.append("—" if not f.get("resolvable") else
                     f"{_pct(f['bounded_decade_80_resolvable'])} ({f['resolvable']})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parts_table(by_group: dict[str, dict[str, Any]]) -> str:
    """Per group, how often each part of the reported interval held the truth on its own (with how many cases had
    that part): the band and mixture intervals the answer takes the hull of, and the runs' bracket it is cut to."""
    head = ("truths", *(f"{part} {level}%" for level in LEVELS for part in PARTS))
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] + ["---:"] * (len(head) - 1)) + " |"]
    for name, f in by_group.items():
        if f.get(f"{PARTS[0]}_coverage_80") is None:
            continue
        cells = [name] + [f"{_pct(f[f'{part}_coverage_{level}'])} ({f[f'{part}_n_{level}']})"
                          for level in LEVELS for part in PARTS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=40, help="cross-family cases, spread over the families x "
                                                          "placements in turn (default 40: two of each)")
    ap.add_argument("--paper", type=int, default=6, help="cases of the paper's own family in the grid (default 6)")
    ap.add_argument("--bootstrap", type=int, default=50, help="cluster-bootstrap refits per fit (default 50)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the truths and their noise")
    ap.add_argument("--placements", type=float, nargs="+", default=list(PLACEMENTS),
                    help=f"only the cross-family cases at these placements (default all: {list(PLACEMENTS)}), "
                         f"each the same truth as in a run of them all")
    ap.add_argument("--workers", type=int, default=1, help="processes running cases side by side (default 1)")
    ap.add_argument("--json", type=str, default=None, help="also write the figures and every case to this file "
                                                           "(rewritten after every case)")
    ap.add_argument("--from-json", type=str, nargs="+", default=None,
                    help="no runs: the figures of the cases in these --json files (finished or cut short; several, "
                         "e.g. of several seeds, are pooled)")
    args = ap.parse_args(argv)
    if args.from_json:
        saved = []
        for path in args.from_json:
            with open(path) as fh:
                saved.append(json.load(fh))
        pooled = groups([_with_resolvable(r, x["truths"]) for x in saved for r in x["rows"]])
        print(table(pooled))
        print(parts_table(pooled))
        print(f"\n{sum(x['done'] for x in saved)} cases from {len(saved)} file(s): seeds "
              f"{[x['seed'] for x in saved]}, bootstrap {sorted({x['bootstrap'] for x in saved})}")
        return {"figures": pooled}
    t0 = time.perf_counter()
    todo = cases(args.cases, args.paper, args.seed, args.placements)
    rows: list[dict[str, Any]] = []

    def out() -> dict[str, Any]:
        return {"cases": args.cases, "paper": args.paper, "bootstrap": args.bootstrap, "seed": args.seed,
                "workers": args.workers, "done": len(rows), "wall_s": round(time.perf_counter() - t0, 1),
                "figures": groups(rows), "rows": sorted(rows, key=lambda r: r["case"]),
                "truths": [asdict(c) for c in todo]}

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with (Progress(*columns) as bar, ProcessPoolExecutor(max_workers=max(1, min(args.workers, len(todo)))) as pool):
        task = bar.add_task("cases", total=len(todo))
        for fut in as_completed([pool.submit(run_case, (c, args.bootstrap)) for c in todo]):
            rows.append(fut.result())
            bar.advance(task)
            if args.json:
                write_json(args.json, out())
    result = out()
    print(table(result["figures"]))
    print(parts_table(result["figures"]))
    print(f"\n{len(rows)} cases ({args.cases} cross-family, {args.paper} paper family), bootstrap {args.bootstrap}, "
          f"seed {args.seed}, {args.workers} worker(s), {result['wall_s']} s")
    return result


def _with_resolvable(row: dict[str, Any], truths: list[dict[str, Any]]) -> dict[str, Any]:
    """A saved row with ``resolvable``, recomputed from its saved truth when the row predates it."""
    if "resolvable" in row or row["family"] == PAPER:
        return row
    truth = next(t for t in truths if t["index"] == row["case"])
    return {**row, "resolvable": resolvable(Case(**{k: v for k, v in truth.items() if k != "paper"}))}


def write_json(path: str, data: dict[str, Any]) -> None:
    """A run's figures and rows, every float finite (NaN refused)."""
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1, allow_nan=False, default=str)


if __name__ == "__main__":
    main()
