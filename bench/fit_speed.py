"""Fitting speed: our fitter against the Chinchilla-replication recipe, measured in the same run, on the same data.

Baseline (Besiroglu et al. 2024, "Chinchilla Scaling: A replication attempt"): the Chinchilla law in log space,
Huber(δ = 1e-3) summed over log L̂ − log L, scipy L-BFGS-B from every point of a 4,500-start grid
(a, b ∈ {0, 5, ..., 25}, e ∈ {−1, −0.5, ..., 1}, α, β ∈ {0, 0.5, ..., 2}), best final objective kept. It is given
the exact gradient (a stronger baseline than the numeric one: ~4x faster). Data: tests/data/chinchilla-points.csv
less the 5 highest losses (240 points, as the replication).

Ours: fitting.fit.fit (variable-projection start grid, 8 BFGS runs in whitened coordinates). Also timed: a full
multi-start fit of `joint` on 150 points (target < 0.5 s) and 1,000 cluster-bootstrap refits of `joint` over
trunks on 2 processes (target < 60 s). Figures are printed as ratios; the latest are in BENCHMARKS.md.

    .venv/bin/python bench/fit_speed.py
"""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.special import logsumexp

from upscale.fitting.bootstrap import bootstrap
from upscale.fitting.fit import fit
from upscale.fitting.laws import get_law
from upscale.fitting.synthetic import TABLE2, design, generate

DELTA = 1e-3
DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "chinchilla-points.csv"


def chinchilla_points() -> pd.DataFrame:
    df = pd.read_csv(DATA)
    return df.sort_values("loss", kind="stable").iloc[:-5].reset_index(drop=True)


def baseline(df: pd.DataFrame) -> tuple[float, np.ndarray]:
    """The replication's recipe: best of 4,500 L-BFGS-B runs; returns (objective, (a, b, e, alpha, beta))."""
    log_n, log_d, y = np.log(df["N"].to_numpy()), np.log(df["D"].to_numpy()), np.log(df["loss"].to_numpy())

    def objective(p: np.ndarray) -> tuple[float, np.ndarray]:
        a, b, e, alpha, beta = p
        Z = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(y, e)])
        lse = logsumexp(Z, axis=0)
        r = lse - y
        huber = np.where(np.abs(r) <= DELTA, 0.5 * r * r, DELTA * (np.abs(r) - 0.5 * DELTA))
        w = np.exp(Z - lse) * np.clip(r, -DELTA, DELTA)
        grad = np.array([w[0].sum(), w[1].sum(), w[2].sum(), -(w[0] * log_n).sum(), -(w[1] * log_d).sum()])
        return float(huber.sum()), grad

    grid = itertools.product(np.arange(0, 30, 5), np.arange(0, 30, 5), np.arange(-1, 1.5, 0.5),
                             np.arange(0, 2.5, 0.5), np.arange(0, 2.5, 0.5))
    best = (np.inf, np.zeros(5))
    for start in grid:
        res = minimize(objective, np.array(start, dtype=float), jac=True, method="L-BFGS-B")
        if res.fun < best[0]:
            best = (float(res.fun), res.x)
    return best


def timed(fn, repeats: int = 1):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    df = chinchilla_points()
    law = get_law("chinchilla")
    t_base, (obj_base, p) = timed(lambda: baseline(df))
    t_ours, ours = timed(lambda: fit(law, df), repeats=5)
    print(f"Chinchilla law, {len(df)} real points")
    print(f"  baseline (4,500 L-BFGS-B starts, exact gradient): {t_base:8.2f} s  objective {obj_base:.10f}  "
          f"A={np.exp(p[0]):.1f} B={np.exp(p[1]):.1f} E={np.exp(p[2]):.4f} alpha={p[3]:.4f} beta={p[4]:.4f}")
    print(f"  ours (fitting.fit, median of 5):                  {t_ours:8.3f} s  objective {ours.objective:.10f}  "
          f"A(N)={ours.params['B']:.1f} B(D)={ours.params['A']:.1f} E={ours.params['E']:.4f} "
          f"alpha(N)={ours.params['beta']:.4f} beta(D)={ours.params['alpha']:.4f}")
    print(f"  speed-up: {t_base / t_ours:.0f}x; objective ours/baseline: {ours.objective / obj_base:.8f}")

    joint = get_law("joint")
    table = generate(joint, TABLE2["upcycled"], design(joint), noise=0.003, trunk_noise=0.003, seed=7)
    t_joint, jfit = timed(lambda: fit(joint, table), repeats=5)
    print(f"joint, {len(table)} points, full multi-start fit (median of 5): {t_joint:.3f} s "
          f"({t_joint / 0.5:.2f}x the 0.5 s target)")
    t_boot, boot = timed(lambda: bootstrap(joint, table, jfit, n=1000, seed=0, workers=2))
    print(f"joint, 1,000 cluster-bootstrap refits over {table['trunk'].nunique()} trunks, 2 processes: "
          f"{t_boot:.1f} s ({t_boot / 60:.2f}x the 60 s target; {boot.n_failed} failed)")


if __name__ == "__main__":
    main()
