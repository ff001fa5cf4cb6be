"""Calibration of D*, measured: known laws in, the user's analysis run on their noisy observations, and how often its
D*, its 80% and 95% intervals and its flags tell the truth. A simulation: nothing trains.

Ground truths: the paper's Table 2 laws (dense and from-scratch MoE Chinchilla on (D, N), upcycled `joint` on
(D1, D2, N1), one E shared by all three) with every scale and exponent perturbed (scales and α3 by exp N(0, 0.3),
exponents by exp N(0, 0.1), E by exp N(0, 0.1)). Each truth is put on one of three grids:

- paper: fitting/synthetic.py's DEFAULT_GRID (the paper's six sizes 15M-1.1B; D1 = D2 over 5e8-3.2e10 tokens, from
  scratch 1e8-1e13);
- mid: four sizes 44M-0.5B, D = D1 = D2 in {5e8, 2e9, 8e9, 3.2e10} (bench/active_design.py's grid);
- tiny: the demo's three sizes (N1 = 32,928, 73,968 and 131,392), D = D1 = D2 in {1.5e4, 6e4, 2.5e5, 1e6};

and its token columns are rescaled so that the true D* lands where its class wants it: the observations are the law
at D·k (every table, the same k), i.e. the exact law with A, α1 and α2 re-expressed for the new unit (``rescale``), so
the true D* moves by 1/k and nothing else about the law changes. Classes, by where the true D* at the grid's largest
N1 lies relative to the grid's D1 = D2 token range: ``inside``; ``near`` (within 10x outside it, above or below);
``far-above`` and ``far-below`` (14x to 300x outside); ``none`` (no crossing at all over the grid's range ±5 decades:
one of the laws' B is raised at that N1 so that the other law wins everywhere by 0.5-3% of the loss).

Observations: fitting/synthetic.py's ``design`` and ``generate`` (log-normal trunk effect + point noise, each with
σ drawn from {0.003, 0.005, 0.01}; trunks as the planner makes them). Every truth then runs the user's path,
``analyze({"dense", "scratch", "upcycled"}, n1s=[largest N1], bootstrap=B, seed=...)``, and ``score`` reads its D*
record. Figures per class and overall:

- ``coverage_80`` / ``coverage_95``: the share of truths with a true D* whose interval holds it (an open end is
  unbounded; a case without an interval counts as not covered), with its standard error ``*_se``;
- ``missed``: the share of truths with a crossing in the searched range for which the analysis reports none;
  ``false``: the share of truths without one there for which it reports one;
- ``median_abs_log10_error``: median |log10(D̂*/D*)| over the cases where both exist;
- ``extrapolation``, ``unhealthy``, ``out_of_range`` (the analysis says D* lies above or below its searched range)
  and ``flagged`` (any of the three): shares of the class; ``flagged_where`` (extrapolation or out of range) is the
  flag for where D* lies alone, since a fit can be unhealthy wherever D* is.

Goals (the issue): coverage within 5 points of nominal for ``inside``; every far case flagged (``flagged``, and
``flagged_where``). The truths' classes are interleaved in the run and ``--json`` is rewritten after every case, so a
run cut short still has figures of every class: ``--from-json`` prints them without running anything.

    nice -n 10 .venv/bin/python bench/calibration.py [--quick] [--truths N] [--bootstrap B] [--seed S]
        [--workers W] [--json OUT] [--from-json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from upscale.fitting.analysis import analyze
from upscale.fitting.dstar import crossings
from upscale.fitting.laws import get_law
from upscale.fitting.summary import FittedLaw
from upscale.fitting.synthetic import DEFAULT_GRID, E_TABLE2, N1_TABLE3, TABLE2, design, generate

CHIN, JOINT = get_law("chinchilla"), get_law("joint")
CLASSES = ("inside", "near", "far-above", "far-below", "none")
SHARES = {"inside": 0.45, "near": 0.2, "far-above": 0.1, "far-below": 0.1, "none": 0.15}  # of --truths
NOISES = (0.003, 0.005, 0.01)  # σ of the log-normal trunk effect and of the point noise, each drawn from these
WINDOW = 5.0  # decades either side of the grid's token range in which the true crossings are found
_DEMO = (32_928, 73_968, 131_392)  # the demo's sizes (nano, 2x48, micro): N1 = L·(16d² + 2d) + d
_MID_TOKENS = (5e8, 2e9, 8e9, 3.2e10)
_TINY_TOKENS = (1.5e4, 6e4, 2.5e5, 1e6)
GRIDS: dict[str, dict[str, tuple[float, ...]]] = {
    "paper": {c: DEFAULT_GRID[c] for c in ("D", "N", "D1", "D2", "N1")},
    "mid": {"D": _MID_TOKENS, "N": N1_TABLE3[1:5], "D1": _MID_TOKENS, "D2": _MID_TOKENS, "N1": N1_TABLE3[1:5]},
    "tiny": {"D": _TINY_TOKENS, "N": _DEMO, "D1": _TINY_TOKENS, "D2": _TINY_TOKENS, "N1": _DEMO},
}
SCALES = tuple(GRIDS)
QUICK = (("inside", "paper"), ("far-above", "mid"), ("far-below", "tiny"))


# ---------------------------------------------------------------------------------------------------------------- laws

def rescale(law: str, params: dict[str, float], k: float) -> dict[str, float]:
    """The law's parameters in a new token unit: P'(D) = P(D·k), exactly (a law of the same family). Chinchilla:
    A' = A·k^−α. Joint, with c = log k: log A' = log A − (α1 + α2)·c + α3·c², α1' = α1 − α3·c, α2' = α2 − α3·c."""
    p = dict(params)
    c = math.log(k)
    if law == "chinchilla":
        p["A"] = params["A"] * math.exp(-params["alpha"] * c)
    else:
        a1, a2, a3 = params["alpha1"], params["alpha2"], params["alpha3"]
        p["A"] = params["A"] * math.exp(-(a1 + a2) * c + a3 * c * c)
        p["alpha1"], p["alpha2"] = a1 - a3 * c, a2 - a3 * c
    return p


def gap(moe: dict[str, float], up: dict[str, float], n1: float, tokens: np.ndarray) -> np.ndarray:
    """L_MoE(N1, D) − L_upcycled(D, D, N1): positive where upcycling wins."""
    t = np.asarray(tokens, float)
    n = np.full(t.shape, n1)
    return CHIN.predict(moe, {"D": t, "N": n}) - JOINT.predict(up, {"D1": t, "D2": t, "N1": n})


def true_dstar(moe: dict[str, float], up: dict[str, float], n1: float, lo: float,
               hi: float) -> tuple[str, float | None]:
    """The true laws' D* over [lo, hi] as the analysis states it, by fitting/dstar.py's ``crossings`` and its D*:
    ("crossing", D*), ("below", None) when from scratch wins over the whole range, ("above", None) when no crossing
    from upcycling to from scratch lies in it."""
    star = crossings(FittedLaw(CHIN, moe), FittedLaw(JOINT, up), n1, span=(lo, hi)).dstar
    return ("above", None) if math.isinf(star) else ("below", None) if star == 0 else ("crossing", star)


# -------------------------------------------------------------------------------------------------------------- truths

@dataclass
class Truth:
    index: int
    cls: str
    scale: str
    seed: int
    k: float  # the token unit: observations are the Table-2-like law at D·k
    noise: float
    trunk_noise: float
    params: dict[str, dict[str, float]]  # dense, moe, upcycled in the tables' units
    n1: float
    token_range: tuple[float, float]  # the grid's D1 = D2 range
    dstar: float | None  # the true first crossing over the window; None when there is none
    state: str  # "crossing" | "above" | "below" over the window
    factor: float  # how far outside the token range the true D* is (1 inside; None-like 0 without one)
    extra: dict[str, Any] = field(default_factory=dict)


def perturb(rng: np.random.Generator) -> dict[str, dict[str, float]]:
    E = E_TABLE2 * math.exp(rng.normal(0, 0.1))
    out = {}
    for kind, base in TABLE2.items():
        p = {}
        for name, v in base.items():
            if name == "E":
                p[name] = E
            elif name in ("A", "B", "alpha3"):
                p[name] = v * math.exp(rng.normal(0, 0.3))
            else:
                p[name] = v * math.exp(rng.normal(0, 0.1))
        out[kind] = p
    return out


def _window(token_range: tuple[float, float]) -> tuple[float, float]:
    return token_range[0] / 10**WINDOW, token_range[1] * 10**WINDOW


def _classify(dstar: float | None, token_range: tuple[float, float]) -> tuple[str, float]:
    lo, hi = token_range
    if dstar is None:
        return "none", 0.0
    if lo <= dstar <= hi:
        return "inside", 1.0
    factor = dstar / hi if dstar > hi else lo / dstar
    if factor <= 10:
        return "near", factor
    return ("far-above" if dstar > hi else "far-below"), factor


def _target(cls: str, token_range: tuple[float, float], rng: np.random.Generator) -> float:
    lo, hi = token_range
    if cls == "inside":
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))
    if cls == "near":
        f = 10 ** rng.uniform(0.15, 0.95)
        return hi * f if rng.random() < 0.5 else lo / f
    f = 10 ** rng.uniform(1.15, 2.5)
    return hi * f if cls == "far-above" else lo / f


def _no_crossing(params: dict[str, dict[str, float]], n1: float, window: tuple[float, float],
                 rng: np.random.Generator) -> dict[str, Any]:
    """Raise one law's B so that the other wins over the whole window by 0.5-3% of the loss at the closest point."""
    t = np.geomspace(*window, 2000)
    g = gap(params["moe"], params["upcycled"], n1, t)
    loss = CHIN.predict(params["moe"], {"D": t, "N": np.full(t.shape, n1)})
    margin = rng.uniform(0.005, 0.03)
    if rng.random() < 0.5:  # upcycling always wins: lift the from-scratch law
        need = float(np.max(-g + margin * loss))
        kind, winner = "moe", "upcycle"
    else:  # from scratch always wins: lift the upcycled law
        need = float(np.max(g + margin * loss))
        kind, winner = "upcycled", "scratch"
    p = params[kind]
    p["B"] += max(need, 0.0) / n1 ** -p["beta"]
    return {"winner": winner, "margin": margin}


def draw_truth(index: int, cls: str, scale: str, seed: int) -> Truth:
    rng = np.random.default_rng([seed, index])
    grid = GRIDS[scale]
    n1 = float(max(grid["N1"]))
    token_range = (float(min(grid["D1"] + grid["D2"])), float(max(grid["D1"] + grid["D2"])))
    window = _window(token_range)
    noise, trunk_noise = (float(rng.choice(NOISES)) for _ in range(2))
    for _ in range(200):
        law = perturb(rng)
        extra: dict[str, Any] = {}
        if cls == "none":
            k = 10 ** rng.uniform(-1, 1) * (1e4 if scale == "tiny" else 1.0)
            params = {kind: rescale("chinchilla" if kind != "upcycled" else "joint", p, k) for kind, p in law.items()}
            extra = _no_crossing(params, n1, window, rng)
        else:  # the law's own first crossing at N1, then the unit that puts it at the class's target
            state, d_law = true_dstar(law["moe"], law["upcycled"], n1, 1e6, 1e16)
            if state != "crossing":
                continue
            k = d_law / _target(cls, token_range, rng)
            params = {kind: rescale("chinchilla" if kind != "upcycled" else "joint", p, k) for kind, p in law.items()}
        state, dstar = true_dstar(params["moe"], params["upcycled"], n1, *window)
        got, factor = _classify(dstar, token_range)
        if got == cls:
            return Truth(index, cls, scale, int(rng.integers(2**31)), k, noise, trunk_noise, params, n1,
                         token_range, dstar, state, factor, extra)
    raise RuntimeError(f"no {cls} truth on the {scale} grid in 200 draws (seed {seed}, truth {index})")


def allocate(n: int, quick: bool) -> list[tuple[str, str]]:
    """(class, scale) of each truth: classes by SHARES (largest remainders), scales in turn within each class."""
    if quick:
        return list(QUICK[:n])
    raw = {c: SHARES[c] * n for c in CLASSES}
    counts = {c: int(v) for c, v in raw.items()}
    for c in sorted(CLASSES, key=lambda c: counts[c] - raw[c])[:n - sum(counts.values())]:
        counts[c] += 1
    return [(c, SCALES[i % len(SCALES)]) for c in CLASSES for i in range(counts[c])]


def tables(truth: Truth) -> dict[str, Any]:
    """The three observation tables: fitting/synthetic.py's design and generator, one noise seed per table."""
    grid = GRIDS[truth.scale]
    chin = design(CHIN, {"D": grid["D"], "N": grid["N"]})
    up = design(JOINT, {"D1": grid["D1"], "D2": grid["D2"], "N1": grid["N1"]})
    return {"dense": generate(CHIN, truth.params["dense"], chin, truth.noise, truth.trunk_noise, truth.seed),
            "scratch": generate(CHIN, truth.params["moe"], chin, truth.noise, truth.trunk_noise, truth.seed + 1),
            "upcycled": generate(JOINT, truth.params["upcycled"], up, truth.noise, truth.trunk_noise,
                                 truth.seed + 2)}


# ------------------------------------------------------------------------------------------------------------- scoring

def interval_bounds(iv: dict[str, Any] | None) -> tuple[float, float] | None:
    """An interval of the record as numbers: an open end (or a missing value) unbounded."""
    if iv is None:
        return None
    lo = -math.inf if iv.get("low_open") or iv.get("low") is None else float(iv["low"])
    hi = math.inf if iv.get("high_open") or iv.get("high") is None else float(iv["high"])
    return lo, hi


def json_interval(iv: tuple[float, float] | None) -> list[float | None] | None:
    """``interval_bounds``'s numbers as strict JSON: an unbounded end null."""
    return None if iv is None else [v if math.isfinite(v) else None for v in iv]


def read_result(r: dict[str, Any]) -> dict[str, Any]:
    """What the scoring needs from one D* result of the analysis record (``analysis.upcycled[i].dstar["results"][j]``,
    as to_json writes it): the one place that knows the record's fields."""
    intervals = r.get("intervals") or {}
    return {"dstar": r["dstar"], "state": r["dstar_state"], "search_range": tuple(r["search_range"]),
            "80": interval_bounds(intervals.get("80")), "95": interval_bounds(intervals.get("95")),
            "extrapolation": bool(r["extrapolation"]["flagged"]), "unhealthy": r["health"] == "unhealthy"}


def score(truth: Truth, r: dict[str, Any] | None) -> dict[str, Any]:
    """One case's outcome: the truth's state over the searched range against the analysis's, coverage, error and
    flags. ``r`` None: the analysis has no D* (no fit, or it failed), which is a flag of its own."""
    row: dict[str, Any] = {"truth": truth.index, "class": truth.cls, "scale": truth.scale, "k": truth.k,
                           "noise": truth.noise, "trunk_noise": truth.trunk_noise, "true_dstar": truth.dstar,
                           "true_state": truth.state, "factor": truth.factor}
    if r is None:
        return {**row, "result": False, "dstar": None, "state": None, "true_state_in_range": None,
                "covered_80": False if truth.dstar else None, "covered_95": False if truth.dstar else None,
                "log10_error": None, "extrapolation": False, "unhealthy": True, "out_of_range": False,
                "flagged": True}
    got = read_result(r)
    lo, hi = got["search_range"]
    in_range, _ = true_dstar(truth.params["moe"], truth.params["upcycled"], truth.n1, lo, hi)

    def covered(level: str) -> bool | None:
        if truth.dstar is None:
            return None
        iv = got[level]
        return iv is not None and iv[0] <= truth.dstar <= iv[1]

    error = (abs(math.log10(got["dstar"] / truth.dstar)) if got["dstar"] and truth.dstar else None)
    out_of_range = got["state"] != "crossing"
    return {**row, "result": True, "dstar": got["dstar"], "state": got["state"], "search_range": [lo, hi],
            "true_state_in_range": in_range, "interval_80": json_interval(got["80"]),
            "interval_95": json_interval(got["95"]),
            "covered_80": covered("80"), "covered_95": covered("95"), "log10_error": error,
            "extrapolation": got["extrapolation"], "unhealthy": got["unhealthy"], "out_of_range": out_of_range,
            "flagged": got["extrapolation"] or got["unhealthy"] or out_of_range}


def run_case(args: tuple[Truth, int]) -> dict[str, Any]:
    truth, bootstrap = args
    t0 = time.perf_counter()
    try:
        a = analyze(tables(truth), n1s=[truth.n1], bootstrap=bootstrap, seed=truth.seed).to_json()
    except Exception as e:  # the user's path raising is an outcome to count, not a crash
        row = score(truth, None)
        return {**row, "error": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}
    star = next((u["dstar"] for u in a["upcycled"] if u["dstar"]), None)
    row = score(truth, star["results"][0] if star else None)
    row["problems"] = len(a["problems"])
    rests_on = star["results"][0].get("health_problems", []) if star else []
    row["health_problems"] = sorted({f"{p['kind']}: {p['fit']}" for p in rests_on})
    row["seconds"] = time.perf_counter() - t0
    return row


# ------------------------------------------------------------------------------------------------------------- figures

def share(values: Sequence[bool | None]) -> tuple[float | None, float | None, int]:
    """The share of true values among those known (None: not counted), its standard error and how many counted."""
    v = [bool(x) for x in values if x is not None]
    if not v:
        return None, None, 0
    p = float(np.mean(v))
    return p, math.sqrt(p * (1 - p) / len(v)), len(v)


def figures(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    cov80, se80, n_cov = share([r["covered_80"] for r in rows])
    cov95, se95, _ = share([r["covered_95"] for r in rows])
    has = [r for r in rows if r["true_state_in_range"] == "crossing"]
    hasnt = [r for r in rows if r["true_state_in_range"] not in (None, "crossing")]
    errors = [r["log10_error"] for r in rows if r["log10_error"] is not None]
    return {
        "n": len(rows),
        "coverage_80": cov80, "coverage_80_se": se80, "coverage_95": cov95, "coverage_95_se": se95,
        "with_true_dstar": n_cov,
        "missed": share([r["state"] != "crossing" for r in has])[0], "with_crossing_in_range": len(has),
        "false": share([r["state"] == "crossing" for r in hasnt])[0], "without_crossing_in_range": len(hasnt),
        "median_abs_log10_error": float(np.median(errors)) if errors else None, "with_both": len(errors),
        "extrapolation": share([r["extrapolation"] for r in rows])[0],
        "unhealthy": share([r["unhealthy"] for r in rows])[0],
        "out_of_range": share([r["out_of_range"] for r in rows])[0],
        "flagged": share([r["flagged"] for r in rows])[0],
        "flagged_where": share([r["extrapolation"] or r["out_of_range"] for r in rows])[0],
        "no_result": sum(not r["result"] for r in rows),
    }


def _within(coverage: float | None, nominal: float, points: float = 0.05) -> bool | None:
    """The issue's goal for a coverage; None where there is none to judge (no such truths, or no such interval)."""
    return None if coverage is None else abs(coverage - nominal) <= points


def _fmt(v: Any, pct: bool = True) -> str:
    if v is None:
        return "—"
    return f"{100 * v:.0f}%" if pct else f"{v:.2f}"


def table(by_class: dict[str, dict[str, Any]]) -> str:
    head = ("class", "n", "cov 80%", "cov 95%", "missed", "false", "med |log10 err|", "extrap.", "unhealthy",
            "out of range", "flagged", "extrap. or out of range")
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] + ["---:"] * (len(head) - 1)) + " |"]
    for name, f in by_class.items():
        cells = [name, str(f["n"]),
                 f"{_fmt(f['coverage_80'])} ± {_fmt(f['coverage_80_se'])}" if f["coverage_80"] is not None else "—",
                 f"{_fmt(f['coverage_95'])} ± {_fmt(f['coverage_95_se'])}" if f["coverage_95"] is not None else "—",
                 f"{_fmt(f['missed'])} ({f['with_crossing_in_range']})",
                 f"{_fmt(f['false'])} ({f['without_crossing_in_range']})",
                 f"{_fmt(f['median_abs_log10_error'], False)} ({f['with_both']})",
                 _fmt(f["extrapolation"]), _fmt(f["unhealthy"]), _fmt(f["out_of_range"]), _fmt(f["flagged"]),
                 _fmt(f["flagged_where"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--truths", type=int, default=None, help="ground truths (default 60; 3 with --quick)")
    ap.add_argument("--bootstrap", type=int, default=None, help="cluster-bootstrap refits per fit (default 100; "
                                                                "20 with --quick)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the truths and their noise")
    ap.add_argument("--quick", action="store_true", help="3 truths (inside, far above, far below), a small bootstrap")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes running truths side by side")
    ap.add_argument("--json", type=str, default=None, help="also write the figures and every case to this file")
    ap.add_argument("--from-json", type=str, nargs="+", default=None,
                    help="no runs: the figures of the cases in these files (--json outputs, finished or cut short; "
                         "several, e.g. of several seeds, are pooled)")
    args = ap.parse_args(argv)
    n = args.truths or (len(QUICK) if args.quick else 60)
    bootstrap = args.bootstrap if args.bootstrap is not None else (20 if args.quick else 100)
    t0 = time.perf_counter()
    if args.from_json:
        saved = []
        for path in args.from_json:
            with open(path) as fh:
                saved.append(json.load(fh))
        seeds = [x["seed"] for x in saved]
        return report([c for x in saved for c in x["cases"]], sum(x["truths"] for x in saved),
                      saved[0]["bootstrap"] if len({x["bootstrap"] for x in saved}) == 1 else None,
                      seeds[0] if len(seeds) == 1 else seeds, args.workers, sum(x["wall_s"] for x in saved),
                      [t for x in saved for t in x.get("truth_params", [])], args.json)
    truths = [draw_truth(i, c, s, args.seed) for i, (c, s) in enumerate(allocate(n, args.quick))]
    # classes interleaved, so that the figures of a run cut short (--json is rewritten after every case) are of all
    order = sorted(truths, key=lambda t: (sum(u.cls == t.cls for u in truths[:t.index]) / _count(truths, t.cls),
                                          CLASSES.index(t.cls)))
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=max(1, min(args.workers, len(truths)))) as pool:
        for row in pool.map(run_case, [(t, bootstrap) for t in order]):
            print(f"truth {row['truth']:3d} {row['class']:9s} {row['scale']:5s} true D* {row['true_dstar'] or 0:9.3g} "
                  f"got {row['state']} {row['dstar'] or 0:9.3g} cov80 {row['covered_80']} cov95 {row['covered_95']} "
                  f"flagged {row['flagged']} {row['seconds']:.1f}s", file=sys.stderr, flush=True)
            rows.append(row)
            if args.json and len(rows) < len(truths):
                _write(args.json, {"truths": n, "bootstrap": bootstrap, "seed": args.seed, "done": len(rows),
                                   "wall_s": round(time.perf_counter() - t0, 1), "cases": rows})
    return report(rows, n, bootstrap, args.seed, args.workers, round(time.perf_counter() - t0, 1),
                  [asdict(t) for t in truths], args.json)


def report(rows: list[dict[str, Any]], n: int, bootstrap: int | None, seed: int | list[int], workers: int,
           wall_s: float,
           truths: list[dict[str, Any]], path: str | None) -> dict[str, Any]:
    """The figures of ``rows``: printed as tables, and written with every case to ``path``."""
    by_class = {c: figures([r for r in rows if r["class"] == c]) for c in CLASSES if any(r["class"] == c for r in rows)}
    by_class["all"] = figures(rows)
    inside = [r for r in rows if r["class"] == "inside"]
    far = [r for r in rows if r["class"] in ("far-above", "far-below")]
    out = {
        "truths": n, "done": len(rows), "bootstrap": bootstrap, "seed": seed, "workers": workers, "wall_s": wall_s,
        "classes": by_class,
        "inside_by_scale": {s: figures([r for r in inside if r["scale"] == s]) for s in SCALES
                            if any(r["scale"] == s for r in inside)},
        "goals": {
            "inside_coverage_80_within_5_points": _within(by_class.get("inside", {}).get("coverage_80"), 0.80),
            "inside_coverage_95_within_5_points": _within(by_class.get("inside", {}).get("coverage_95"), 0.95),
            "every_far_case_flagged": all(r["flagged"] for r in far) if far else None,
            "every_far_case_flagged_for_where_dstar_is": (all(r["extrapolation"] or r["out_of_range"] for r in far)
                                                          if far else None),
        },
        "cases": rows,
        "truth_params": truths,
    }
    print(table(by_class))
    print("\ninside, by grid:")
    print(table(out["inside_by_scale"]))
    print(f"\ngoals: {json.dumps(out['goals'])}; {len(rows)} of {n} truths, bootstrap {bootstrap}, {wall_s} s")
    if path:
        _write(path, out)
    return out


def _count(truths: Sequence[Truth], cls: str) -> int:
    return sum(t.cls == cls for t in truths)


def _write(path: str, data: dict[str, Any]) -> None:
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1, allow_nan=False, default=str)


if __name__ == "__main__":
    main()
