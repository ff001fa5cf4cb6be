"""Held-out decay ends with each trunk's own decay parameters (today) against parameters pooled over its family.

fitting/curve_observations.py fits the multi-power law to each trunk's curve and decays, so a trunk's decay parameters
(B, C, beta, gamma) come from its own two or three decays; its held-out errors set every predicted row's weight. The
candidate: a trunk's decay parameters fixed at the median of its family's other trunks' own fits, and only L0, A and
alpha fitted to its curve and decays. Each observed decay is held out in turn and predicted both ways (the pooled
parameters never see the trunk's own decays), and the root mean square of the log errors is printed for both, with
their ratio, on two sets of curves:

- the simulation's (bench/design_curves.py: a noise-floor law, not the multi-power one), every decay of the
  active-design grid bought, one ground truth per seed (bench/active_design.py's draw);
- the demo's real curves (bench/data/demo_grid.json, the naive and drop groups beside the from-scratch trunks).

    .venv/bin/python bench/pooled_decays.py [--truths N]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

import numpy as np
from active_design import Sim, draw_truths, grid_plan
from demo_replay import DATA, Replay
from design_curves import FIT, CurveSim
from threadpoolctl import threadpool_limits

from upscale.fitting.curve_law import DECAY_PARAMS, Curve, fit_curves, predict
from upscale.fitting.curve_observations import HeldOut, TrunkCurves, predict_decay_ends


def _end(params: dict[str, float], lr: np.ndarray) -> float:
    return float(predict(params, Curve(lr, np.array([lr.size])))[0])


def pooled_errors(trunks: Sequence[TrunkCurves]) -> list[float]:
    """Each observed decay's held-out log error with the trunk's decay parameters pooled over the other trunks."""
    own = {t.trunk: fit_curves([t.curve, *t.decays], options=FIT).params for t in trunks if t.decays}
    out = []
    for t in trunks:
        others = [p for name, p in own.items() if name != t.trunk]
        if not others:
            continue
        fixed = {k: float(np.median([p[k] for p in others])) for k in DECAY_PARAMS}
        for i, d in enumerate(t.decays):
            rest = t.decays[:i] + t.decays[i + 1:]
            params = fit_curves([t.curve, *rest], fixed=fixed, options=FIT).params
            out.append(HeldOut(t.trunk, int(d.lr.size), float(d.loss[-1]), _end(params, d.lr)).log_error)
    return out


def family_errors(curves: CurveSim, family: str, segments: set[str]) -> tuple[list[float], list[float]]:
    """Today's held-out log errors and the pooled ones, for one family with everything in ``segments`` bought."""
    _, trunks, _, _ = curves.family_trunks(family, segments)
    today = predict_decay_ends(trunks, [], FIT)
    return [h.log_error for h in today.held_out], pooled_errors(trunks)


def rms(errors: Sequence[float]) -> float:
    return float(np.sqrt(np.mean(np.square(errors)))) if errors else float("nan")


def row(label: str, today: list[float], pooled: list[float]) -> dict:
    out = {"curves": label, "n_today": len(today), "n_pooled": len(pooled), "rms_today": rms(today),
           "rms_pooled": rms(pooled)}
    out["ratio"] = out["rms_pooled"] / out["rms_today"]
    print(f"{label:32s} held out {len(today):3d} / {len(pooled):3d}   rms today {out['rms_today']:.4f}   "
          f"pooled {out['rms_pooled']:.4f}   pooled / today {out['ratio']:.2f}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--truths", type=int, default=4, help="simulated ground truths (one seed each)")
    ap.add_argument("--json", type=str, default=None, help="also write the rows to this file")
    args = ap.parse_args()
    t0, rows = time.perf_counter(), []
    p = grid_plan()
    target = float(max(s.observation.N1 for s in p.observations()))
    sim_errors: dict[str, tuple[list[float], list[float]]] = {"up": ([], []), "moe": ([], [])}
    with threadpool_limits(1):
        for seed in range(args.truths):
            sim = Sim(p, draw_truths(1, target, np.random.default_rng(100 + seed))[0], target, seed=100 + seed)
            bought = {q.segment for q in sim.pool} | {s for lay in sim.curves.layout.values() for s, _, _ in lay.pieces}
            for family, (today, pooled) in sim_errors.items():
                got = family_errors(sim.curves, family, bought)
                today += got[0]
                pooled += got[1]
        rows += [row(f"simulated {family} ({args.truths} truths)", *errs) for family, errs in sim_errors.items()]
        data = json.loads(DATA.read_text())
        for group in ("naive", "drop"):
            curves = Replay(data, group).curves
            bought = {s for lay in curves.layout.values() for s, _, _ in lay.pieces} | {
                s for lay in curves.layout.values() for s in lay.decays}
            for family in sorted({lay.family for lay in curves.layout.values()}):
                if group == "drop" and family == "moe":
                    continue  # the same from-scratch trunks as the naive group's
                rows.append(row(f"demo {group if family == 'up' else 'from scratch'}", *family_errors(
                    curves, family, bought)))
    print(f"{time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
