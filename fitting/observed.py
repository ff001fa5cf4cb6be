"""What the runs show before any law: upcycled against from scratch at matched budgets, with their noise.

A matched pair is an upcycled run at (N1, D1, D2) and a from-scratch run at (N = N1, D = D1): the verdict's own
comparison (upcycling pays when from scratch, given the D1 tokens the dense model cost, ends worse; fitting/dstar.py
``decide``). On the diagonal D1 = D2 = D it is Eq. 13's comparison, so the diagonal pairs bracket D* by themselves:
D* lies above the largest budget where upcycling leads beyond noise and below the first larger budget where it
trails beyond noise. A law that puts D* outside that bracket, or a verdict against a pair measured beyond noise,
contradicts the runs, and the runs win (fitting/answer.py).

Noise: the third differences of log loss along each curve of budgets equally spaced in log tokens (from scratch
along D at one size; upcycled along D2 at one (N1, D1)), which a smooth curve keeps near zero: a law-free estimate,
so a law's misfit does not inflate it. Rows repeated at the same coordinates average first. A gap is beyond noise
past ``Z`` standard deviations of the difference of two runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from upscale.fitting.curve_observations import is_predicted
from upscale.fitting.laws import LOSS

Z = 2.0  # a gap beyond this many noise SDs (of a difference of two runs) is beyond noise
# The bracket each D* interval level is cut to: at 95% a pair must differ by 3 SDs to bound it. The noise is read
# along curves and misses the trunk effects two runs of a pair also differ by, so at 2 SDs the bracket alone held
# the paper family's truth in 93% of 60 in-grid cases, below what a 95% interval needs (BENCHMARKS.md).
Z_BY_LEVEL = {0.8: Z, 0.95: 3.0}
SPACING = 0.1  # log steps within 10% of each other count as equal (budgets 4x and 4.2x apart)
FALLBACK_NOISE = 0.01  # log-loss SD assumed when no size has enough runs to measure the scatter (said so)


def _mean_by(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    return df.groupby(columns, as_index=False)[LOSS].mean()


def _third_differences(df: pd.DataFrame, curve: list[str], x: str) -> np.ndarray:
    """Third differences of log loss along every curve (rows sharing ``curve``) with at least four budgets equally
    spaced in log ``x``: a smooth curve's are near zero, so they measure the runs' scatter (each has variance
    20·σ² for independent noise σ)."""
    out = []
    for _, part in df.groupby(curve):
        part = part.sort_values(x)
        steps = np.diff(np.log(part[x].to_numpy(dtype=float)))
        if len(part) >= 4 and np.allclose(steps, steps[0], rtol=SPACING):
            out.append(np.diff(np.log(part[LOSS].to_numpy(dtype=float)), 3))
    return np.concatenate(out) if out else np.empty(0)


def noise(scratch: pd.DataFrame, upcycled: pd.DataFrame) -> dict[str, Any]:
    """The per-run log-loss SD (``sd``), from how many third differences, and a note when it is assumed."""
    d3 = np.concatenate([_third_differences(_mean_by(scratch, ["N", "D"]), ["N"], "D"),
                         _third_differences(_mean_by(upcycled, ["N1", "D1", "D2"]), ["N1", "D1"], "D2")])
    if not d3.size:
        return {"sd": FALLBACK_NOISE, "n": 0,
                "note": f"no curve has four budgets equally spaced to measure the noise on; {FALLBACK_NOISE:.0%} "
                        f"assumed"}
    return {"sd": max(math.sqrt(float(np.mean(d3 ** 2)) / 20), 1e-4), "n": int(d3.size), "note": ""}


@dataclass(frozen=True)
class Observed:
    """The matched pairs of one upcycling group, the noise, and per size the observed bracket on D*."""

    pairs: list[dict[str, Any]]
    noise: dict[str, Any]
    brackets: dict[float, dict[str, Any]]

    def bracket(self, n1: float, z: float = Z) -> dict[str, Any] | None:
        """The observed bracket on D* at ``n1``, a pair beyond noise past ``z`` SDs (the record's brackets: Z)."""
        if z == Z:
            return self.brackets.get(float(n1))
        threshold = z * math.sqrt(2) * self.noise["sd"]
        return _bracket([{**p, "leader": _leader(p["log_gap"], threshold)} for p in self.pairs
                         if p["diagonal"] and math.isclose(p["n1"], n1, rel_tol=1e-9)])

    def pair(self, n1: float, d1: float, d2: float) -> dict[str, Any] | None:
        for p in self.pairs:
            if math.isclose(p["n1"], n1, rel_tol=1e-9) and math.isclose(p["d1"], d1, rel_tol=1e-9) \
                    and math.isclose(p["d2"], d2, rel_tol=1e-9):
                return p
        return None

    def to_json(self) -> dict[str, Any]:
        return {"noise": self.noise, "pairs": self.pairs,
                "brackets": [{"n1": n1, **b} for n1, b in sorted(self.brackets.items())]}


def observe(scratch: pd.DataFrame, upcycled: pd.DataFrame) -> Observed:
    """The matched pairs, noise and brackets of the observed rows of ``scratch`` and one group's ``upcycled``."""
    scratch = scratch[~is_predicted(scratch)]
    upcycled = upcycled[~is_predicted(upcycled)]
    sd = noise(scratch, upcycled)
    threshold = Z * math.sqrt(2) * sd["sd"]
    sc = _mean_by(scratch, ["N", "D"])
    up = _mean_by(upcycled, ["N1", "D1", "D2"])
    merged = up.merge(sc, left_on=["N1", "D1"], right_on=["N", "D"], suffixes=("_up", "_scratch"))
    pairs = []
    for r in merged.sort_values(["N1", "D1", "D2"]).itertuples(index=False):
        gap = math.log(r.loss_scratch) - math.log(r.loss_up)  # > 0: upcycling leads
        pairs.append({"n1": float(r.N1), "d1": float(r.D1), "d2": float(r.D2), "loss_upcycled": float(r.loss_up),
                      "loss_scratch": float(r.loss_scratch), "log_gap": gap, "noise": threshold,
                      "leader": _leader(gap, threshold),
                      "diagonal": bool(math.isclose(r.D1, r.D2, rel_tol=1e-9))})
    brackets = {n1: _bracket([p for p in pairs if p["n1"] == n1 and p["diagonal"]])
                for n1 in sorted({p["n1"] for p in pairs})}
    return Observed(pairs, {**sd, "gap_threshold": threshold}, {k: v for k, v in brackets.items() if v})


def _leader(log_gap: float, threshold: float) -> str:
    return "upcycle" if log_gap > threshold else "scratch" if log_gap < -threshold else "tie"


def _bracket(diagonal: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """D* ≥ the largest diagonal budget where upcycling leads beyond noise (before any budget where it trails);
    D* ≤ the first larger budget where it trails beyond noise. None-valued ends are open."""
    if not diagonal:
        return None
    ordered = sorted(diagonal, key=lambda p: p["d1"])
    first_trail = next((p for p in ordered if p["leader"] == "scratch"), None)
    leads = [p for p in ordered if p["leader"] == "upcycle" and (first_trail is None or p["d1"] < first_trail["d1"])]
    low = leads[-1]["d1"] if leads else None
    trail = next((p for p in ordered if p["leader"] == "scratch" and (low is None or p["d1"] > low)), None)
    return {"low": low, "high": trail["d1"] if trail else None, "budgets": [p["d1"] for p in ordered],
            "leaders": [p["leader"] for p in ordered], "gaps": [p["log_gap"] for p in ordered]}
