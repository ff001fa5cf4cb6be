"""The active designs replayed on real training: the demo sweep's losses and curves (bench/data/demo_grid.json,
written by bench/export_curves.py), every method of bench/active_design.py choosing from them as from its simulated
pool, so that curve predictions, stops and costs meet real curves once.

The pool is the demo's observations of one upcycled group (``--group``, naive 4x2 by default) and its from-scratch
ones; a decay costs the planner's FLOPs of the DAG it needs (`Dag` over the exported segments: a trunk up to its
branch point, the dense trunk and decay an upcycled trunk starts from, what was bought before free), and a bought
trunk part reveals the curve points the run logged up to there. The curves the designs read are the real ones, their
predicted decays (fitting/curve_observations.py) scored against real held-out decays.

There is no truth: the full grid's fit is the reference. E is fixed for every fit at the value that minimises the
two laws' summed squared log residuals over the whole pool (E shared, the rest free per law: one bounded 1-d
search). The reference D* is the full fit's crossing at the largest N1 (``--n1``: another of the grid's sizes; a
size where the full fit's laws do not cross has no D* to pin down, and is refused). A design's width is the
delta-method width at the full fit and its noise estimate; coverage is whether the design's 80% profile interval
holds the full grid's D*. One case: ``--seeds`` replays it with several seeds of the random choosers and the stop
rule's parameter draws (the pilot is fixed: the cheapest corner, as in the simulation).

The demo grid decays only at its budgets, so its off-grid decays are predicted, never bought. With
``--any-branch-data`` (bench/data/demo_any_branch.json: the same grid trained with a budget at every off-grid point
besides, by bench/export_curves.py) the any-branch designs may buy them at their real losses and FLOPs (and the
retrained span where a trunk was trained past one, as in the simulation); the pool, the full grid and its D* stay the
demo grid's.

The demo grid is too small for a design to save much: its pilot alone costs 0.23 of it. ``--grid-of`` replays a wider
grid at the demo's scale trained with its off-grid decays (bench/data/wide_any_branch.json: 4 sizes, budgets 2x apart
over 8x; wide64_any_branch.json: 3 sizes, budgets 4x apart over 64x as in the simulation; inside_any_branch.json: the
same moved up 2x; naive upcycling): the grid that run holds (`grid_view`: the off-grid decays removed, each trunk's
pieces merged back to the grid's cuts; the demo's view is the demo grid itself, plan, FLOPs and losses), the any-branch
designs free to buy the off-grid decays from the same run.

    nice -n 10 .venv/bin/python bench/demo_replay.py [--group naive] [--seeds 3] [--any-branch-data FILE]
        [--grid-of FILE] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from active_design import (  # bench/active_design.py: the methods, fit and intervals replayed here
    LAW,
    METHODS,
    Dag,
    DagSegment,
    Fitter,
    Point,
    Sim,
    State,
    run_method,
    table,
)
from design_curves import TRUNK_KINDS, CurveSim, Piece, layouts
from scipy.optimize import minimize_scalar

from upscale.fitting.curve_law import Curve
from upscale.fitting.design import DstarCriterion, dstar_gradient, noise_from_fits
from upscale.fitting.dstar import crossings
from upscale.fitting.summary import FittedLaw

DATA = Path(__file__).resolve().parent / "data" / "demo_grid.json"
DECAY_FRACTION = 0.1  # the demo's `train.decay.fraction`: off-grid decays decay over as much of their run


class DemoCurves(CurveSim):
    """The demo's real curves in the shape `CurveSim` predicts from: curve steps are optimiser steps, every trunk
    piece's logged points after the warmup, every done decay's logged points (its last the observed end)."""

    def __init__(self, data: dict, trunks: set[str], pieces: list[Piece]) -> None:
        self.layout = {t: lay for t, lay in layouts(pieces).items() if t in trunks}
        exported = {t["trunk"]: t for t in data["trunks"] if t["trunk"] in trunks}
        first = next(iter(exported.values()))
        self.unit = first["tokens_per_step"]
        lr = np.asarray(first["lr_multipliers"])
        self.warmup = int(np.argmax(lr >= 1.0)) + 1
        self.shape, self.final = "linear", float(first["decays"][0]["lr_multipliers"][-1])
        self.family_of = {t: lay.family for t, lay in self.layout.items()}
        self.cache, self.fits = {}, {}
        self.piece_curves, self.decay_curves = {}, {}
        for t, lay in self.layout.items():
            e = exported[t]
            if not np.allclose(e["lr_multipliers"], self.lr(len(e["lr_multipliers"]), None)):
                raise ValueError(f"trunk {t}: its LRs are not the warmup-stable schedule the predictions assume")
            steps = np.array([tok for tok, _ in e["curve"]]) // self.unit
            loss = np.array([v for _, v in e["curve"]])
            for sid, start, end in lay.pieces:
                keep = (steps > max(start // self.unit, self.warmup)) & (steps <= end // self.unit)
                self.piece_curves[sid] = (steps[keep], loss[keep])
            for d in e["decays"]:
                at = np.array([tok for tok, _ in d["curve"]]) // self.unit
                keep = at > d["branch_tokens"] // self.unit
                self.decay_curves[d["segment_key"]] = Curve(np.asarray(d["lr_multipliers"]), at[keep],
                                                            np.array([v for _, v in d["curve"]])[keep])
        self.offgrid = self.offgrid_decays(DECAY_FRACTION)


def pool_of(data: dict, group: str) -> list[Point]:
    out = []
    for o in data["observations"]:
        if o["kind"] == "scratch":
            out.append(Point("moe", {"D": float(o["D"]), "N": float(o["N1"])}, o["trunk"], o["segment_key"]))
        elif o["kind"] == "upcycled" and o["method"] == group:
            out.append(Point("up", {"D1": float(o["D1"]), "D2": float(o["D2"]), "N1": float(o["N1"])}, o["trunk"],
                             o["segment_key"]))
    return out


def fit_all(pool: list[Point], y: dict[str, float], e: float) -> tuple[Fitter, float]:
    """Both laws fitted to the whole pool with E fixed at ``e`` (each the best of three starts around Table 2's):
    the fit and its summed squared log residuals."""
    best = Fitter(e)
    sse = 0.0
    for k in LAW:
        mine = [q for q in pool if q.law == k]
        tab, obs = table(mine, k), np.array([y[q.segment] for q in mine])
        fits = []
        for scale in (1.0, 1.05, 0.95):
            f = Fitter(e)
            fits.append((f.fit(k, tab, obs, f.nominal[k] * scale), f))
        got, f = min(fits, key=lambda x: x[0])
        best.theta[k], best.params[k], best.residuals[k] = f.theta[k], f.params[k], f.residuals[k]
        sse += got
    return best, sse


class Replay(Sim):
    """One real case: the demo's pool, costs and curves, the full grid's fit standing in for the truth."""

    def __init__(self, data: dict, group: str, extended: dict | None = None, n1: float | None = None) -> None:
        self.pool = pool_of(data, group)
        if not any(q.law == "up" for q in self.pool):
            groups = sorted({o["method"] for o in data["observations"] if o["kind"] == "upcycled"})
            raise SystemExit(f"no upcycled observation of group {group!r}: choose one of {groups}")
        self.y = {o["segment_key"]: float(o["loss"]) for o in data["observations"]}
        self.by_segment = {q.segment: q for q in self.pool}
        segs = data["segments"]
        self.dag = Dag({s["key"]: DagSegment(s["flops"], s["tokens"], tuple(s["parents"]), s["start_tokens"],
                                             s["end_tokens"]) for s in segs}, data["total_flops"])
        self.dag.full = self.dag.cost({q.segment for q in self.pool})  # the full grid: this pool's DAG, not the demo's
        sizes = sorted({q.coords.get("N1", q.coords.get("N")) for q in self.pool})
        if n1 is not None and n1 not in sizes:
            raise SystemExit(f"--n1 {n1:g} is not a size of the grid: choose one of "
                             f"{', '.join(f'{n:g}' for n in sizes)}")
        self.target = sizes[-1] if n1 is None else n1
        self.budgets = sorted({q.coords["D"] for q in self.pool if q.law == "moe"})
        pieces = [Piece(s["key"], s["kind"], s["start_tokens"], s["end_tokens"], s["trunk"]) for s in segs]
        self.curves = DemoCurves(data, {q.trunk for q in self.pool}, pieces)
        if extended is not None:
            self.observe_trained_offgrid(data, extended)
        self.virtual = self.offgrid_points()
        self.offgrid_pool = [] if extended is None else list(self.virtual.values())  # else nothing trained them
        self.pilot = self._pilot()
        ceiling = min(self.y[q.segment] for q in self.pool)
        search = minimize_scalar(lambda e: fit_all(self.pool, self.y, e)[1], bounds=(0.05, 0.99 * ceiling),
                                 method="bounded", options={"xatol": 1e-3})
        self.oracle, _ = fit_all(self.pool, self.y, float(search.x))
        self.true = self.oracle.params
        moe, up = FittedLaw(LAW["moe"], self.true["moe"]), FittedLaw(LAW["up"], self.true["up"])
        self.true_dstar = crossings(moe, up, self.target).dstar
        _, grad = dstar_gradient(moe, up, self.target, *(tuple(n for n in LAW[k].param_names if n != "E")
                                                         for k in ("moe", "up")))
        if grad is None:
            crossing = [f"{n:g}" for n in sizes if 0 < crossings(moe, up, n).dstar < math.inf]
            raise SystemExit(f"the full grid's laws do not cross at N1 = {self.target:g} (D* = {self.true_dstar:g}): "
                             f"no D* to pin down there; they cross at N1 = {', '.join(crossing) or 'no size'} (--n1)")
        full = self.rows(self.oracle, self.pool)
        noise = noise_from_fits([(self.oracle.residuals[k], full[k]) for k in LAW])
        self.oracle_criterion = DstarCriterion(grad, self.rows(self.oracle, []), noise)
        self.run_cost = {q.segment: self.dag.cost({q.segment}) for q in self.pool}

    def fitter(self) -> Fitter:
        return Fitter(self.oracle.e)

    def observe_trained_offgrid(self, data: dict, extended: dict) -> None:
        """The off-grid decays as a real run trained them (``extended``: the demo grid with a budget at every
        off-grid point besides, bench/data/demo_any_branch.json), buyable by the any-branch designs: each trunk's
        off-grid decays become that run's (branch and end as it cut them), with their observed ends and curves, and
        each a segment of this DAG hanging from the trunk piece it branches from, at that run's FLOPs. Trunks are
        matched by their axes (the two runs cut them at other points, so their keys differ)."""
        def axes(t: dict) -> tuple:
            return tuple(sorted((k, v) for k, v in t["axes"].items() if k != "sweep"))

        ours = {t["trunk"]: axes(t) for t in data["trunks"]}
        theirs = {axes(t): t for t in extended["trunks"]}
        segments = {s["key"]: s for s in extended["segments"]}
        unit = self.curves.unit
        for t, lay in self.curves.layout.items():
            grid_ends = {end for _, end in lay.decays.values()}
            offgrid = []
            for d in theirs[ours[t]]["decays"]:
                if d["end_tokens"] in grid_ends:
                    continue
                key, branch, end = f"{t}@{d['end_tokens']}", d["branch_tokens"], d["end_tokens"]
                lr = np.asarray(d["lr_multipliers"])
                if not np.allclose(lr, self.curves.lr(end // unit, branch // unit)):
                    raise ValueError(f"trunk {t}: the decay to {end} tokens is not the schedule the predictions assume")
                at = np.array([tok for tok, _ in d["curve"]]) // unit
                keep = at > branch // unit
                self.curves.decay_curves[key] = Curve(lr, at[keep], np.array([v for _, v in d["curve"]])[keep])
                self.y[key] = float(d["loss"])
                piece = lay.piece_reaching(branch)[0]
                seg = segments[d["segment_key"]]
                self.dag.segments[key] = DagSegment(seg["flops"], seg["tokens"], (piece,), branch, end)
                offgrid.append((key, branch // unit, end // unit))
            self.curves.offgrid[t] = offgrid


def grid_view(raw: dict) -> dict:
    """The grid of a run trained with its off-grid decays too (bench/data/wide*_any_branch.json), as if it had been
    trained alone: its budgets are the upcycled D1s (the grid's D1, D2 and from-scratch budgets are one list), the
    decays that end elsewhere are dropped, and each trunk's pieces are merged back to the cuts the grid needs (a
    merged piece keeps its last piece's key, so what branches from it still finds its parent, and sums the FLOPs)."""
    grid = {o["D1"] for o in raw["observations"] if o["kind"] == "upcycled"}
    dropped = {o["segment_key"] for o in raw["observations"]
               if (o["kind"] == "upcycled" and o["D2"] not in grid) or (o["kind"] == "scratch" and o["D"] not in grid)}
    segments = [s for s in raw["segments"] if s["key"] not in dropped]
    children: dict[str, set[str]] = {}
    for s in segments:
        for p in s["parents"]:
            children.setdefault(p, set()).add(s["key"])
    kept = []
    for trunk in dict.fromkeys(s["trunk"] for s in segments):
        pieces = sorted((s for s in segments if s["trunk"] == trunk and s["kind"] in TRUNK_KINDS),
                        key=lambda s: s["start_tokens"])
        run: list[dict] = []
        for s, after in zip(pieces, [*pieces[1:], None], strict=False):
            run.append(s)
            if after is None or children.get(s["key"], set()) - {after["key"]}:  # something else branches here
                kept.append({**s, "flops": sum(r["flops"] for r in run), "tokens": sum(r["tokens"] for r in run),
                             "parents": run[0]["parents"], "start_tokens": run[0]["start_tokens"]})
                run = []
    merged = {s["key"] for s in segments if s["kind"] in TRUNK_KINDS}
    out = [s for s in segments if s["key"] not in merged] + kept
    trunks = [{**t, "decays": [d for d in t["decays"] if d["segment_key"] not in dropped]} for t in raw["trunks"]]
    return {**raw, "observations": [o for o in raw["observations"] if o["segment_key"] not in dropped],
            "segments": out, "trunks": trunks, "total_flops": sum(s["flops"] for s in out)}


def replay(data: dict, group: str, seeds: int, methods: tuple[str, ...], extended: dict | None = None,
           n1: float | None = None) -> dict:
    t0 = time.perf_counter()
    sim = Replay(data, group, extended, n1)
    ref = State(list(sim.pool), sim.fitter())
    sim.refit(ref, set(LAW))
    width_full = sim.width(sim.pool)
    # methods a seed changes (draws, choosers)
    random = {"random", "cost_random", "upscale_curves", "upscale_curves_any_branch", "grid_stop"}
    out: dict[str, list] = {}
    for m in methods:
        for seed in range(seeds if m in random else 1):
            o = run_method(sim, m, width_full, seed=seed)
            out.setdefault(m, []).append(o)
            print(f"{m} seed {seed}: {o.fraction:.3f} covered {o.covered} stopped {o.stopped}", file=sys.stderr,
                  flush=True)
    return {
        "group": group, "target_n1": sim.target, "E": sim.oracle.e, "full_dstar": sim.true_dstar,
        "full_width_80": width_full, "full_covered": sim.covers(ref),
        "noise": sim.oracle_criterion.noise.to_json(), "pool": len(sim.pool), "full_flops": sim.dag.full,
        "demo_flops": data["total_flops"],
        "pilot_fraction": sim.dag.cost({q.segment for q in sim.pilot}) / sim.dag.full,
        "fraction_of_full_flops": {m: [o.fraction for o in v] for m, v in out.items()},
        "covered": {m: [o.covered for o in v] for m, v in out.items()},
        "covered_delta": {m: [o.covered_delta for o in v] for m, v in out.items()},
        "predicted_share": {m: [o.predicted_share for o in v] for m, v in out.items()},
        "stopped_trunks": {m: [o.stopped for o in v] for m, v in out.items()},
        "stopped_flops": {m: [o.stopped_flops for o in v] for m, v in out.items()},
        "grid_stop_spent": [o.spent_total for o in out.get("grid_stop", [])],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help=f"the grid to replay (default {DATA.name})")
    ap.add_argument("--group", default="naive", help="the upcycled group whose observations join the pool")
    ap.add_argument("--seeds", type=int, default=1, help="seeds of the random choosers and the stop rule's draws")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods to replay")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    ap.add_argument("--any-branch-data", type=Path, default=None,
                    help="the demo grid trained with its off-grid decays too (bench/data/demo_any_branch.json): "
                         "the any-branch designs may then buy them; without it they are only predicted")
    ap.add_argument("--n1", type=float, default=None,
                    help="the dense size (parameters) whose D* the designs pin down; default the grid's largest")
    ap.add_argument("--grid-of", type=Path, default=None,
                    help="a grid trained with its off-grid decays too (bench/data/*_any_branch.json): replay its "
                         "grid (`grid_view`), the any-branch designs free to buy the off-grid decays; replaces "
                         "--data and --any-branch-data")
    args = ap.parse_args(argv)
    if args.grid_of is not None and (args.data or args.any_branch_data):
        ap.error("--grid-of replaces --data and --any-branch-data: give either --grid-of or those")
    if args.grid_of is not None:
        extended = json.loads(args.grid_of.read_text())
        data = grid_view(extended)
    else:
        extended = json.loads(args.any_branch_data.read_text()) if args.any_branch_data else None
        data = json.loads((args.data or DATA).read_text())
    figures = replay(data, args.group, args.seeds, tuple(args.methods.split(",")), extended, args.n1)
    text = json.dumps(figures, indent=2, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
    print(text)
    if args.json:
        args.json.write_text(text)
    return figures


if __name__ == "__main__":
    main()
