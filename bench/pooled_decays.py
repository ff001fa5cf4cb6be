"""Held-out decay ends with each trunk's own decay parameters, pooled over its family, and the family's choice.

fitting/curve_observations.py predicts a family's decay ends with each trunk's decay parameters (B, C, beta, gamma)
fitted to its own two or three decays ("own") or fixed at the median of the family's other trunks' fits ("pooled"),
whichever predicts its held-out decays better, and scores that choice nested (each held-out decay predicted the way
the family's other held-out decays favour) so that picking the better of two errors does not make it look smaller.
Every observed decay is held out in turn; this prints the root mean square of the held-out log errors each way and
the nested one the predictions' weight rests on, on two sets of curves:

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

from upscale.fitting.curve_observations import CurvePredictions, predict_decay_ends

WAYS = ("own", "pooled", "chosen")


def family_errors(curves: CurveSim, family: str, segments: set[str]) -> CurvePredictions:
    """One family's predictions with everything in ``segments`` bought: its held-out errors each way."""
    _, trunks, _, _ = curves.family_trunks(family, segments)
    return predict_decay_ends(trunks, [], FIT)


def row(label: str, got: Sequence[CurvePredictions]) -> dict:
    """The held-out RMS each way over several families' predictions (each weighted by its held-out decays)."""
    n = np.array([len(g.held_out) for g in got], dtype=float)
    square = {"own": [g.held_out_rms["own"] ** 2 for g in got],
              "pooled": [g.held_out_rms.get("pooled", np.nan) ** 2 for g in got],
              "chosen": [g.sd ** 2 for g in got]}
    out = {"curves": label, "n_held_out": int(n.sum()), "pooled_chosen": sum(g.pooling == "pooled" for g in got),
           "families": len(got), **{f"rms_{k}": float(np.sqrt(np.sum(n * v) / n.sum())) for k, v in square.items()}}
    print(f"{label:32s} held out {out['n_held_out']:3d}   rms own {out['rms_own']:.4f}   pooled "
          f"{out['rms_pooled']:.4f}   chosen (nested) {out['rms_chosen']:.4f}   pooled in {out['pooled_chosen']} of "
          f"{len(got)}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--truths", type=int, default=4, help="simulated ground truths (one seed each)")
    ap.add_argument("--json", type=str, default=None, help="also write the rows to this file")
    args = ap.parse_args()
    t0, rows = time.perf_counter(), []
    p = grid_plan()
    target = float(max(s.observation.N1 for s in p.observations()))
    sim_got: dict[str, list[CurvePredictions]] = {"up": [], "moe": []}
    with threadpool_limits(1):
        for seed in range(args.truths):
            sim = Sim(p, draw_truths(1, target, np.random.default_rng(100 + seed))[0], target, seed=100 + seed)
            bought = {q.segment for q in sim.pool} | {s for lay in sim.curves.layout.values() for s, _, _ in lay.pieces}
            for family, got in sim_got.items():
                got.append(family_errors(sim.curves, family, bought))
        rows += [row(f"simulated {family} ({args.truths} truths)", got) for family, got in sim_got.items()]
        data = json.loads(DATA.read_text())
        for group in ("naive", "drop"):
            curves = Replay(data, group).curves
            bought = {s for lay in curves.layout.values() for s, _, _ in lay.pieces} | {
                s for lay in curves.layout.values() for s in lay.decays}
            for family in sorted({lay.family for lay in curves.layout.values()}):
                if group == "drop" and family == "moe":
                    continue  # the same from-scratch trunks as the naive group's
                rows.append(row(f"demo {group if family == 'up' else 'from scratch'}",
                                [family_errors(curves, family, bought)]))
    print(f"{time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
