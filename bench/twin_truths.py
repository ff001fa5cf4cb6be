"""Which in-grid truths can no analysis bound within a decade? Twin truths the runs cannot tell apart.

bench/cross_family.py asks every in-grid 80% D* interval to be bounded and at most a decade wide while its intervals
cover the truth at least 75% of the time over truths of four law families. bench/family_oracle.py shows an analysis
that knows the family could meet the width goal on most of them. This bounds what any analysis can do, by Le Cam's
two-point argument.

For each in-grid truth T1 (the saved ``truths`` of a cross-family run), it searches each benchmark family for a twin
T2: a valid truth of that family (every arm's loss falls with every budget over the searched range and stays above
E, as ``cross_family._falls`` asks of a drawn truth) whose D* at the reference size is one of ``RATIOS`` times T1's
(more than a decade above or below it), with every other parameter least-squares fitted so that its mean log losses
on the grid come as close to T1's as they can. The family's free scale is solved for that D* (``cross_family.place``)
and the fit starts from T1 itself (in T1's family) and from draws of the family. Closeness is measured in the runs'
own noise: T1's point and trunk noise give the covariance Σ of a grid's log losses (a point's own draw plus one draw
shared by every run of one trunk, the tables independent, as fitting/synthetic.py's ``generate`` draws them), and
the distance is the squared Mahalanobis Δ = dᵀΣ⁻¹d of the two truths' mean log losses d over all three tables.

Two Gaussians with one covariance whose means are Δ apart are apart in total variation by TV = 2Φ(√Δ/2) − 1. No
interval at most a decade wide holds both D*s, so for any analysis whose interval is bounded within a decade,
P(covers D*₁ | T1's runs) + P(covers D*₂ | T2's runs) ≤ 1 + TV, and the smaller of the two coverages is at most
(1 + TV)/2 (``max_coverage``). Where that is below 0.8 (Δ < 2.83), an analysis that meets the width goal on both
covers T1 or T2 less than 80% of the time, whatever it does: the runs do not say which of the two is true. The
bound is only as good as the search: a closer twin would lower it, so a twin not found proves nothing.

``--late``: twins of no family, which bind every analysis that does not assume one. T2 is T1 with one arm bent past
the grid by a saturating term of the transfer families' own form: from scratch slowing down, log L_s + ε·H(D)·s(N),
or upcycling gaining late, log L_up − ε·H(D2)·s(N1), with H(D) = (D/D_h)^q / (1 + (D/D_h)^q), q in the transfer
families' range [0.5, 1] (``LATE_Q``), and s(N) = (N/N_ref)^k, the same bend at every size (k = 0) or more at the
larger ones (k = 1, 2: a larger model runs through what the data can teach sooner; ``LATE_K``). For each arm, ratio,
q, k and D_h, ε is the least that keeps upcycling ahead from T1's D* to the ratio times it at the reference size
(the gap's worst point over that stretch, in closed form); a twin counts where its losses still fall with every
budget and stay above E (the checks ``_falls`` makes), a larger model's loss is nowhere above a smaller one's, and
its D* lies more than a decade above T1's or nowhere in the range searched. No fit: a minute for all the truths.
With ``--analyze K`` the user's analysis then runs on K noise draws of each twin that caps coverage below 80% (the
first draw T1's own noise) and is scored against the twin's D*: whether it makes the bet the twin defeats.

    nice -n 10 .venv/bin/python bench/twin_truths.py bench/data/cross_family_mean_band_seed0.json ...
        [--starts 3] [--own-family | --late [--analyze K] [--bootstrap B]] [--workers 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from calibration import json_interval  # bench/calibration.py: the scoring helpers
from cross_family import (
    D_MAX,
    FAMILIES,
    N1_REF,
    SCALE,
    SPAN,
    Case,
    TruthLaw,
    _draw_common,
    _draw_upcycled,
    _falls,
    falling_curves,
    gap,
    log_gap,
    monotone_checks,
    place,
    reported_interval,
    tables,
    true_dstar,
    width_decades,
    write_json,
)
from family_oracle import _pack, _unpack, beside_reported, in_grid_truths
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from scipy.optimize import least_squares
from scipy.stats import norm

from upscale.fitting.analysis import analyze
from upscale.fitting.laws import LOSS, TRUNK

# The twin's D* / T1's: each more than a decade apart, so no interval a decade wide holds both. Above, three: where the
# gap fades slowly past T1's crossing, a twin whose own crossing lies further out can be the closer one.
RATIOS = (10**1.05, 10**1.5, 10**1.9, 10**-1.05)
KINDS = ("dense", "scratch", "upcycled")
_PENALTY = 1e3  # weight of a violated constraint against one noise SD of misfit
_STEPS = 1000  # least-squares evaluations per start
_CHECK = 60  # budgets on which the constraints are checked while fitting (``_falls`` checks 400 at the end)


def whitener(table: pd.DataFrame, noise: float, trunk_noise: float) -> np.ndarray:
    """W with WᵀW = Σ⁻¹ for one table's log losses: σ² on the diagonal plus σ_t² between runs of one trunk."""
    trunk = table[TRUNK].to_numpy()
    cov = noise**2 * np.eye(len(table)) + trunk_noise**2 * (trunk[:, None] == trunk[None, :])
    return np.linalg.inv(np.linalg.cholesky(cov))


def columns(grid: dict[str, pd.DataFrame]) -> dict[str, dict[str, np.ndarray]]:
    """Each table's budget and size columns as arrays (the fit evaluates the laws on them thousands of times)."""
    return {kind: {c: grid[kind][c].to_numpy(float) for c in ("D", "N", "D1", "D2", "N1") if c in grid[kind]}
            for kind in KINDS}


def mean_log_losses(params: dict[str, float], family: str, cols: dict[str, dict[str, np.ndarray]]
                    ) -> dict[str, np.ndarray]:
    """The truth's mean log loss at every run of the grid, per table."""
    return {kind: np.log(TruthLaw(family, kind).predict(params, cols[kind])) for kind in KINDS}


def tv_distance(delta: float) -> float:
    """Total variation between two Gaussians of one covariance, ``delta`` the squared Mahalanobis distance of their
    means."""
    return float(2 * norm.cdf(math.sqrt(max(delta, 0.0)) / 2) - 1)


def max_coverage(delta: float) -> float:
    """The most the smaller of two coverages can be for intervals that cannot hold both truths' D*."""
    return (1 + tv_distance(delta)) / 2


_CHECKS = monotone_checks(_CHECK)
_BUDGETS = _CHECKS[0][0]


def _violations(p: dict[str, float], family: str, target: float) -> np.ndarray:
    """How far ``p`` (its gap zero at ``target`` by ``place``) is from a valid twin whose D* is ``target``, per check
    (0 where it holds): upcycling ahead at every budget below ``target`` and behind just past it, and no curve that
    ``_falls`` checks rising with a budget or reaching E."""
    curves = falling_curves(p, family, _CHECKS)
    d = _BUDGETS
    return np.concatenate([np.maximum(0.0, 1e-4 - gap(p, family, d[d < target / 1.01])),
                           np.maximum(0.0, 1e-4 + gap(p, family, np.array([target * 1.01]))),
                           np.maximum(0.0, np.diff(curves, axis=1)).ravel(),
                           np.maximum(0.0, p["E"] + 1e-6 - curves).ravel()])


class Runs(NamedTuple):
    """What the twin is fitted against: the grid's columns, each table's whitener and T1's mean log losses."""

    cols: dict[str, dict[str, np.ndarray]]
    white: dict[str, np.ndarray]
    mu1: dict[str, np.ndarray]

    @classmethod
    def of(cls, case: Case) -> Runs:
        grid = {k: v.drop(columns=LOSS) for k, v in tables(case).items()}
        cols = columns(grid)
        return cls(cols, {k: whitener(grid[k], case.noise, case.trunk_noise) for k in KINDS},
                   mean_log_losses(case.params, case.family, cols))

    def whitened(self, mu2: dict[str, np.ndarray]) -> np.ndarray:
        """W·d over all three tables, d the difference of ``mu2`` from T1's mean log losses."""
        return np.concatenate([self.white[k] @ (mu2[k] - self.mu1[k]) for k in KINDS])

    def delta(self, mu2: dict[str, np.ndarray]) -> float:
        """Δ = dᵀΣ⁻¹d between T1's mean log losses and ``mu2``, over all three tables."""
        return float(np.sum(self.whitened(mu2) ** 2))


def fit_twin(case: Case, family: str, start: dict[str, float], ratio: float, runs: Runs) -> dict[str, Any] | None:
    """The ``family`` truth nearest ``case``'s (in the runs' noise) with its D* at ``ratio`` x T1's,
    fitted from ``start``: every parameter but the family's free scale, which ``place`` solves for that D*. None where
    the fit ends on no valid twin."""
    target = case.dstar * ratio
    names = [k for k in start if k != SCALE[family]]
    size = sum(len(v) for v in runs.mu1.values()) + len(_violations(place(start, family, target), family, target))

    def twin(x: np.ndarray) -> dict[str, float]:
        return place(_unpack(x, names, start), family, target)

    def residuals(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            try:
                p = twin(x)
                r = np.concatenate([runs.whitened(mean_log_losses(p, family, runs.cols)),
                                    _PENALTY * _violations(p, family, target) / case.noise])
            except (OverflowError, ZeroDivisionError, FloatingPointError):
                return np.full(size, 1e6)  # a step far out of the family's range: as bad as can be
        return np.clip(np.nan_to_num(r, nan=1e6), -1e6, 1e6)  # NaN or a blown-up law: as bad as can be

    p = twin(least_squares(residuals, _pack(start, names), method="trf", x_scale="jac", max_nfev=_STEPS).x)
    with np.errstate(all="ignore"):
        if not (_falls(p, family) and math.isclose(true_dstar(p, family), target, rel_tol=1e-3)):
            return None
        delta = runs.delta(mean_log_losses(p, family, runs.cols))
    return {"family": family, "ratio": ratio, "dstar": target, "delta": delta,
            "max_coverage": max_coverage(delta), "params": p}


def _starts(case: Case, family: str, target: float, n: int) -> list[dict[str, float]]:
    """Starting truths of ``family`` for the twin: T1 itself where the family is T1's, then draws of the family with
    T1's dense and from-scratch laws and their free scale solved to put D* at ``target``."""
    out = [dict(case.params)] if family == case.family else []
    rng = np.random.default_rng([case.seed, FAMILIES.index(family), int(target)])
    common = {k: v for k, v in case.params.items() if k in _draw_common(rng, family)}
    for _ in range(20 * n):
        if len(out) >= n:
            break
        base = _draw_common(rng, family) | common
        p = _draw_upcycled(rng, family, base, target)
        if math.isfinite(true_dstar(p, family)) and _falls(p, family):
            out.append({k: float(v) for k, v in p.items()})
    return out


def twins(args: tuple[Case, int, bool]) -> dict[str, Any]:
    """``case``'s nearest twin per family and ratio, and the closest of them all."""
    case, starts, own_only = args
    runs = Runs.of(case)
    found = []
    for family in (case.family,) if own_only else FAMILIES:
        for ratio in RATIOS:
            target = case.dstar * ratio
            best = None
            for start in _starts(case, family, target, starts):
                t = fit_twin(case, family, start, ratio, runs)
                if t is not None and (best is None or t["delta"] < best["delta"]):
                    best = t
            if best is not None:
                found.append(best)
    closest = min(found, key=lambda t: t["delta"], default=None)
    return {"case": case.index, "family": case.family, "placement": case.placement, "noise": case.noise,
            "trunk_noise": case.trunk_noise, "true_dstar": case.dstar,
            "twins": [{k: v for k, v in t.items() if k != "params"} for t in found],
            "closest": None if closest is None else {k: v for k, v in closest.items()}}


# ----------------------------------------------------------------------------------- late twins: a bend past the grid

LATE_Q = tuple(np.linspace(0.5, 1.0, 6))  # the bend's Hill exponents: cross_family's transfer families draw q here
LATE_K = (0, 1, 2)  # the bend's size exponents: s(N) = (N/N_ref)^k, 1 at the reference (largest) size
_LATE_HALF = 80  # half-way points D_h tried, log-spaced from T1's D* to 100x the twin's
_STRETCH = 400  # budgets between T1's D* and the twin's where upcycling must stay ahead
_SCAN = 4000  # log-grid points over the searched range on which the twin's D* is read
_LATE_CHECKS = monotone_checks(400)  # the curves ``_falls`` checks, for the bent twin
_SIZES = len(_LATE_CHECKS[0])  # rows per arm of dense and from scratch in ``falling_curves``
_SIGN = {"scratch": 1.0, "upcycled": -1.0}  # a bend raises from scratch's loss or lowers upcycling's
_DRAW_STEP = 7919  # noise seeds of the twin's draws: T1's, then this far apart


def hill(d: np.ndarray, half: float, q: float) -> np.ndarray:
    """(d/half)^q / (1 + (d/half)^q): 0 well below ``half``, 1/2 there, 1 well above."""
    z = (np.asarray(d, float) / half) ** q
    return z / (1 + z)


def log_bend(arm: str, eps: float, half: float, q: float, k: float, d: np.ndarray, n: np.ndarray) -> np.ndarray:
    """How far the bend moves ``arm``'s log loss at budgets ``d`` (D, or D2 upcycled) and sizes ``n``:
    ±ε·H(d)·(n/N_ref)^k, up for from scratch, down for upcycling."""
    return _SIGN[arm] * eps * hill(d, half, q) * (np.asarray(n, float) / N1_REF) ** k


def _bent_valid(case: Case, arm: str, eps: float, half: float, q: float, k: float) -> bool:
    """The bent twin's losses still fall with every budget on every curve ``_falls`` checks and stay above E, and
    the bent arm's loss at a larger size is nowhere above a smaller one's (the checks' rows run size by size, the
    sizes ascending)."""
    curves = falling_curves(case.params, case.family, _LATE_CHECKS).copy()
    arm_d, arm_n, _, d2, n1 = _LATE_CHECKS
    rows = slice(_SIZES, 2 * _SIZES) if arm == "scratch" else slice(2 * _SIZES, None)
    d, n = (arm_d, arm_n) if arm == "scratch" else (d2, n1)
    curves[rows] *= np.exp(log_bend(arm, eps, half, q, k, d, n))
    by_size = curves[rows].reshape(_SIZES, -1, curves.shape[1])
    return bool(np.all(np.diff(curves, axis=1) <= 0) and np.all(curves > case.params["E"])
                and np.all(np.diff(by_size, axis=0) <= 0))


def _bent_dstar(case: Case, eps: float, half: float, q: float) -> float:
    """The bent twin's D*: the first budget of the searched range where upcycling stops leading (inf: none)."""
    d = np.geomspace(*SPAN, _SCAN)
    g = log_gap(case.params, case.family, d, case.n1) + eps * hill(d, half, q)  # either bend adds ε·H to the gap
    down = np.flatnonzero((g[:-1] > 0) & (g[1:] <= 0))
    return float(d[down[0] + 1]) if down.size else math.inf


def late_twin(case: Case) -> dict[str, Any] | None:
    """``case``'s nearest bent twin (module docstring, ``--late``): the arm, the bend (ε, D_h, q, k), its D* and Δ, the
    most the twin's coverage can be where T1's is 80% (P1 + P2 ≤ 1 + TV), and how far the bend moves the arm's log
    loss at the grid's largest budget and at the end of the range searched; None where no bend keeps every loss
    falling."""
    runs = Runs.of(case)
    column = {"scratch": (runs.cols["scratch"]["D"], runs.cols["scratch"]["N"]),
              "upcycled": (runs.cols["upcycled"]["D2"], runs.cols["upcycled"]["N1"])}
    best: dict[str, Any] | None = None
    for ratio in (r for r in RATIOS if r > 1):
        target = case.dstar * ratio
        stretch = np.geomspace(case.dstar, target, _STRETCH)
        behind = -log_gap(case.params, case.family, stretch, case.n1)
        for arm, q, k, half in ((a, q, k, h) for a in column for q in LATE_Q for k in LATE_K
                                for h in np.geomspace(case.dstar, 100 * target, _LATE_HALF)):
            eps = 1.001 * max(0.0, float(np.max(behind / hill(stretch, half, q))))
            d, n = column[arm]
            mu2 = {**runs.mu1, arm: runs.mu1[arm] + log_bend(arm, eps, half, q, k, d, n)}
            delta = runs.delta(mu2)
            if best is not None and delta >= best["delta"]:
                continue
            dstar = _bent_dstar(case, eps, half, q)
            if dstar > 10 * case.dstar and _bent_valid(case, arm, eps, half, q, k):
                best = {"family": f"{arm} bent", "arm": arm, "ratio": ratio, "eps": eps, "half": float(half),
                        "q": float(q), "k": k, "dstar": dstar if math.isfinite(dstar) else None, "delta": delta,
                        "max_coverage": max_coverage(delta), "twin_coverage_if_80": 0.2 + tv_distance(delta),
                        "bend_at_top": eps * float(hill(D_MAX, half, q)),
                        "bend_at_end": eps * float(hill(SPAN[1], half, q))}
    return best


class BentLaw(TruthLaw):
    """One arm of a bent twin as ``generate`` reads a law: T1's, the bent arm's loss times exp(±ε·H)."""

    def __init__(self, family: str, kind: str, bend: dict[str, Any]) -> None:
        super().__init__(family, kind)
        self.bend = bend

    def predict(self, params: dict[str, float], table: pd.DataFrame | Mapping[str, np.ndarray]) -> np.ndarray:
        loss = super().predict(params, table)
        b = self.bend
        if self.kind != b["arm"]:
            return loss
        d, n = (table["D"], table["N"]) if self.kind == "scratch" else (table["D2"], table["N1"])
        return loss * np.exp(log_bend(self.kind, b["eps"], b["half"], b["q"], b["k"], d, n))


def analyze_twin(args: tuple[Case, dict[str, Any], int, int]) -> dict[str, Any]:
    """The user's analysis on one noise draw of ``case``'s bent twin (draw 0: T1's own noise, so the two grids differ
    by the bend alone), scored against the twin's D* (none in the range searched: only an interval open above holds
    it)."""
    case, bend, draw, bootstrap = args
    seeded = replace(case, seed=case.seed + _DRAW_STEP * draw)
    a = analyze(tables(seeded, lambda family, kind: BentLaw(family, kind, bend)), n1s=[case.n1],
                bootstrap=bootstrap, seed=seeded.seed)
    result = a.upcycled[0].dstar["results"][0] if a.upcycled and a.upcycled[0].dstar else None
    iv = reported_interval(result, "80")
    truth = bend["dstar"] if bend["dstar"] is not None else math.inf
    return {"case": case.index, "family": case.family, "draw": draw, "interval_80": json_interval(iv),
            "covered_80": iv is not None and iv[0] <= truth <= iv[1], "width_80": width_decades(iv)}


def late(case: Case) -> dict[str, Any]:
    """``case``'s row with its nearest bent twin as ``closest``."""
    found = late_twin(case)
    return {"case": case.index, "family": case.family, "placement": case.placement, "noise": case.noise,
            "trunk_noise": case.trunk_noise, "true_dstar": case.dstar, "twins": [found] if found else [],
            "closest": found}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="bench/cross_family.py --json files: their in-grid cross-family truths")
    ap.add_argument("--starts", type=int, default=3, help="starting truths per family and ratio (default 3)")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--own-family", action="store_true", help="search T1's own family only (the twins an "
                       "analysis that knows the family must tell apart: minutes instead of hours)")
    which.add_argument("--late", action="store_true", help="T1 bent past the grid instead of a family's twins "
                       "(module docstring: the twins every analysis must tell apart; a minute)")
    ap.add_argument("--analyze", type=int, default=0, help="with --late: run the analysis on this many noise draws "
                    "of each twin that caps coverage below 80%% (the first with T1's own noise) and score it against "
                    "the twin's D* (default 0: none)")
    ap.add_argument("--bootstrap", type=int, default=50, help="with --analyze: bootstrap refits per fit (default 50, "
                                                              "as bench/cross_family.py)")
    ap.add_argument("--workers", type=int, default=1, help="processes side by side (default 1)")
    ap.add_argument("--json", type=str, default=None, help="also write every case's twins here")
    args = ap.parse_args(argv)
    if args.analyze and not args.late:
        ap.error("--analyze scores the analysis on bent twins: give --late with it")
    t0 = time.perf_counter()
    todo = in_grid_truths(args.runs)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns) as bar, ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        jobs = pool.map(late, [case for _, case, _ in todo]) if args.late else \
            pool.map(twins, [(case, args.starts, args.own_family) for _, case, _ in todo])
        found = list(bar.track(jobs, total=len(todo), description="truths"))
        capped = [(k, case, r["closest"]) for k, ((_, case, _), r) in enumerate(zip(todo, found, strict=True))
                  if _caps(r)]
        work = [(k, (case, bend, draw, args.bootstrap)) for k, case, bend in capped for draw in range(args.analyze)]
        scored = bar.track(pool.map(analyze_twin, [w for _, w in work]), total=len(work),
                           description="analyses of twins")
        for (k, _), a in zip(work, scored, strict=True):
            found[k].setdefault("twin_analyses", []).append(a)
    return _report(beside_reported(todo, found), time.perf_counter() - t0, args.json)


def _report(rows: list[dict[str, Any]], wall: float, path: str | None) -> dict[str, Any]:
    for r in rows:
        c = r["closest"]
        where = "none in the range searched" if c is None or c["dstar"] is None else \
            f"{c['dstar']:.3g} ({c['dstar'] / r['true_dstar']:.3g}x)"
        bend = "" if c is None or "bend_at_top" not in c else \
            f" (log loss {c['bend_at_top']:+.2%} at the largest budget, {c['bend_at_end']:+.2%} at the range's end)"
        twin = "none found" if c is None else (
            f"{c['family']}{bend} D* {where}, Δ {c['delta']:.2f}, max coverage {c['max_coverage']:.2f}")
        print(f"seed {r['run_seed']} case {r['case']:2d} {r['family']:14s} {r['placement']:g}x  noise "
              f"{r['noise']:.3f}/{r['trunk_noise']:.3f}  twin: {twin}  reported width {r['reported_width_80']}")
    figures: dict[str, Any] = {"all": _figures(rows), "wall_s": round(wall, 1)}
    for placement in sorted({r["placement"] for r in rows}):
        figures[f"{placement:g}x"] = _figures([r for r in rows if r["placement"] == placement])
    analyses = [a for r in rows for a in r.get("twin_analyses", [])]
    if analyses:
        covered = sum(a["covered_80"] for a in analyses)
        figures["twin_analyses"] = {"n": len(analyses), "covered_80": covered,
                                    "bounded_decade_80": sum(a["width_80"] is not None and a["width_80"] <= 1
                                                             for a in analyses)}
        for r in rows:
            for a in r.get("twin_analyses", []):
                print(f"seed {r['run_seed']} case {r['case']:2d} twin draw {a['draw']}: the analysis's 80% interval "
                      f"{a['interval_80']}, {'holds' if a['covered_80'] else 'misses'} the twin's D*")
        print(f"the analysis's 80% interval held the bent twins' D* in {covered} of {len(analyses)} draws")
    f = figures["all"]
    print(f"\n{f['in_grid']} in-grid truths: on {f['twin_below_80']} a twin more than a decade away caps any "
          f"decade-wide interval's coverage below 80%; the analysis bounds {f['reported_bounded_decade']} within a "
          f"decade, {f['reported_bounded_decade_no_twin_below_80']} of the {f['in_grid'] - f['twin_below_80']} "
          f"without such a twin")
    if path:
        write_json(path, {"figures": figures, "rows": rows})
    return figures


def _figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How many truths have a twin that caps coverage below 80%, the nearest twins' Δ and caps, and how many the
    analysis bounds within a decade, with and without such a twin."""
    def bounded(r: dict[str, Any]) -> bool:
        return r["reported_width_80"] is not None and r["reported_width_80"] <= 1

    found = [r["closest"] for r in rows if r["closest"] is not None]
    return {"in_grid": len(rows), "twin_below_80": sum(map(_caps, rows)),
            "median_delta": float(np.median([c["delta"] for c in found])) if found else None,
            "median_cap": float(np.median([c["max_coverage"] for c in found])) if found else None,
            "lowest_cap": min((c["max_coverage"] for c in found), default=None),
            "reported_bounded_decade": sum(map(bounded, rows)),
            "reported_bounded_decade_with_twin_below_80": sum(bounded(r) and _caps(r) for r in rows),
            "reported_bounded_decade_no_twin_below_80": sum(bounded(r) and not _caps(r) for r in rows)}


def _caps(row: dict[str, Any]) -> bool:
    """Whether a truth's nearest twin caps any decade-wide interval's coverage below 80%."""
    return row["closest"] is not None and row["closest"]["max_coverage"] < 0.8


if __name__ == "__main__":
    main()
