"""How tightly could anyone bound D* on the cross-family benchmark's in-grid truths? An oracle that knows the family.

bench/cross_family.py asks every in-grid 80% D* interval to be bounded and at most a decade wide. Whether that is
possible depends on the truth and the noise, not only on the analysis: where the two arms' losses stay within the
runs' noise of each other for a decade past the crossing, the runs cannot place it within a decade. This measures
that limit. For each in-grid truth of a cross-family run (its saved ``truths``), the oracle knows everything a
researcher cannot: the family's functional form, a start at the true parameters and the true noise levels. It draws
``--sims`` new sets of runs from the truth on the same grid with the same point and trunk noise
(fitting/synthetic.py's ``generate``), refits every parameter of the family's from-scratch and upcycled laws to each
(scipy's least_squares on log loss, one E shared, positive parameters fitted in logs), and reads each refit's D* at
the reference size by root finding (bench/cross_family.py's ``true_dstar``). The spread of those D* estimates is how
precisely the grid pins D* down when the law is known exactly: its central 80% (``oracle_80``) is about the narrowest
80% interval a calibrated method can report there. Where it runs past the searched range, or is wider than a decade,
no honest analysis meets the width goal on that truth; where it is narrow, an analysis that does not is leaving
information on the table.

Printed per case: the truth, the oracle's 80% spread and width, and the analysis's reported 80% interval from the
same run's rows; then the goal's share among the truths the oracle can bound within a decade.

    nice -n 10 .venv/bin/python bench/family_oracle.py bench/data/cross_family_mean_band_seed0.json ...
        [--sims 100] [--workers 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import pandas as pd
from cross_family import (
    FAMILIES,
    Case,
    TruthLaw,
    arm_loss,
    tables,
    true_dstar,
    upcycled_loss,
    width_decades,
    write_json,
)
from scipy.optimize import least_squares

from upscale.fitting.laws import LOSS
from upscale.fitting.synthetic import generate

DENSE = ("dA", "da", "dB", "db", "dc")  # the dense arm's parameters: D* does not read them
SIGNED = ("sc", "c1", "c2", "delta")  # parameters that may take either sign (fitted as they are, not in logs)


def _free(params: dict[str, float]) -> list[str]:
    """The parameters D* depends on: every from-scratch and upcycled one (dense left out)."""
    return [k for k in params if k not in DENSE]


def _pack(params: dict[str, float], names: list[str]) -> np.ndarray:
    return np.array([params[k] if k in SIGNED or params[k] <= 0 else math.log(params[k]) for k in names])


def _unpack(x: np.ndarray, names: list[str], template: dict[str, float]) -> dict[str, float]:
    out = dict(template)
    for k, v in zip(names, x, strict=True):
        out[k] = float(v) if k in SIGNED or template[k] <= 0 else float(math.exp(min(v, 50.0)))
    return out


def refit(family: str, truth: dict[str, float], scratch: pd.DataFrame, upcycled: pd.DataFrame) -> dict[str, float]:
    """The family's from-scratch and upcycled parameters least-squares fitted on log loss, started at ``truth``."""
    names = _free(truth)
    log_s, log_u = np.log(scratch[LOSS].to_numpy(float)), np.log(upcycled[LOSS].to_numpy(float))

    def residuals(x: np.ndarray) -> np.ndarray:
        p = _unpack(x, names, truth)
        with np.errstate(all="ignore"):
            try:
                s = arm_loss(p, "s", scratch["D"].to_numpy(float), scratch["N"].to_numpy(float))
                u = upcycled_loss(p, family, upcycled["D1"], upcycled["D2"], upcycled["N1"])
            except (OverflowError, ZeroDivisionError):  # a step far out of the family's range: as bad as can be
                return np.ones(len(log_s) + len(log_u))
            r = np.concatenate([np.log(np.maximum(s, 1e-9)) - log_s, np.log(np.maximum(u, 1e-9)) - log_u])
        return np.where(np.isfinite(r), r, 1.0)

    return _unpack(least_squares(residuals, _pack(truth, names), method="trf", x_scale="jac").x, names, truth)


def _one(case: Case, grid: dict[str, pd.DataFrame], seed: int) -> float:
    """One simulated grid of ``case``'s truth refitted by the family's law: its D* (NaN where the refit fails)."""
    scratch = generate(TruthLaw(case.family, "scratch"), case.params, grid["scratch"].drop(columns=LOSS),
                       case.noise, case.trunk_noise, seed)
    upcycled = generate(TruthLaw(case.family, "upcycled"), case.params, grid["upcycled"].drop(columns=LOSS),
                        case.noise, case.trunk_noise, seed + 1)
    try:
        return true_dstar(refit(case.family, case.params, scratch, upcycled), case.family)
    except (ValueError, FloatingPointError, OverflowError, ZeroDivisionError):
        return math.nan


def oracle(args: tuple[Case, int]) -> dict[str, Any]:
    """``sims`` simulated grids of ``case``'s truth, each refitted by the family's own law: their D* estimates."""
    case, sims = args
    t = tables(case)
    with np.errstate(all="ignore"):  # refits stepping far out of the family's range overflow; counted, not shown
        est = np.array([_one(case, t, case.seed + 1000 * (i + 1)) for i in range(sims)])
        est = np.where(np.isnan(est), math.inf, est)  # a failed refit counts as no crossing: the spread only widens
        lo, hi = (float(np.quantile(est, q)) for q in (0.1, 0.9))
    return {"case": case.index, "family": case.family, "placement": case.placement, "noise": case.noise,
            "trunk_noise": case.trunk_noise, "true_dstar": case.dstar, "sims": sims,
            "oracle_80": [lo, hi if math.isfinite(hi) else None], "oracle_width_80": width_decades((lo, hi)),
            "no_crossing": int(np.sum(~np.isfinite(est)))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="bench/cross_family.py --json files: their in-grid cross-family truths")
    ap.add_argument("--sims", type=int, default=100, help="simulated grids per truth (default 100)")
    ap.add_argument("--workers", type=int, default=1, help="processes side by side (default 1)")
    ap.add_argument("--json", type=str, default=None, help="also write every case's figures here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    todo = in_grid_truths(args.runs)
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        found = list(pool.map(oracle, [(case, args.sims) for _, case, _ in todo]))
    return _report(beside_reported(todo, found), time.perf_counter() - t0, args.json)


def in_grid_truths(paths: list[str]) -> list[tuple[int, Case, dict[str, Any]]]:
    """The in-grid cross-family truths of saved bench/cross_family.py runs: (the run's seed, the truth, the
    analysis's row for it)."""
    todo = []
    for path in paths:
        with open(path) as fh:
            run = json.load(fh)
        rows = {r["case"]: r for r in run["rows"]}
        for t in run["truths"]:
            case = Case(**{k: v for k, v in t.items() if k != "paper"})
            if case.family in FAMILIES and case.in_grid and case.index in rows:
                todo.append((run["seed"], case, rows[case.index]))
    return todo


def beside_reported(todo: list[tuple[int, Case, dict[str, Any]]], found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each truth's figures with the run's seed and the analysis's reported 80% interval and width beside them."""
    return [{**r, "run_seed": seed, "reported_80": row["interval_80"], "reported_width_80": row["width_80"]}
            for (seed, _, row), r in zip(todo, found, strict=True)]


def _report(rows: list[dict[str, Any]], wall: float, path: str | None) -> dict[str, Any]:
    def ok(w: float | None) -> bool:
        return w is not None and w <= 1

    for r in rows:
        print(f"seed {r['run_seed']} case {r['case']:2d} {r['family']:14s} {r['placement']:g}x  noise "
              f"{r['noise']:.3f}/{r['trunk_noise']:.3f}  oracle 80% {_fmt(r['oracle_80'])} "
              f"({_dec(r['oracle_width_80'])})  reported "
              f"{_fmt(r['reported_80'])}")
    feasible = [r for r in rows if ok(r["oracle_width_80"])]
    met = [r for r in feasible if ok(r["reported_width_80"])]
    figures = {"in_grid": len(rows), "oracle_bounded_decade": len(feasible),
               "reported_bounded_decade": sum(ok(r["reported_width_80"]) for r in rows),
               "reported_bounded_decade_where_oracle_is": len(met), "wall_s": round(wall, 1)}
    for placement in sorted({r["placement"] for r in rows}):
        sel = [r for r in rows if r["placement"] == placement]
        widths = [r["oracle_width_80"] for r in sel if r["oracle_width_80"] is not None]
        part = figures[f"{placement:g}x"] = {
            "n": len(sel), "oracle_bounded_decade": sum(ok(r["oracle_width_80"]) for r in sel),
            "oracle_median_width_80": float(np.median(widths)) if widths else None,
            "reported_bounded_decade": sum(ok(r["reported_width_80"]) for r in sel)}
        print(f"{placement:g}x: {len(sel)} truths, the oracle bounds {part['oracle_bounded_decade']} within a decade "
              f"(median width {_dec(part['oracle_median_width_80'])}), the analysis {part['reported_bounded_decade']}")
    print(f"\n{len(rows)} in-grid truths: the oracle bounds {len(feasible)} within a decade at 80%; the analysis "
          f"bounds {figures['reported_bounded_decade']} in all, {len(met)} of the oracle's {len(feasible)}")
    if path:
        write_json(path, {"figures": figures, "rows": rows})
    return figures


def _dec(w: float | None) -> str:
    return "open" if w is None else f"{w:.2f} dec."


def _fmt(iv: list[float | None] | None) -> str:
    if iv is None:
        return "none"
    return "[" + ", ".join("open" if v is None else f"{v:.2g}" for v in iv) + "]"


if __name__ == "__main__":
    main()
