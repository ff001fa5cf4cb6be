"""Held-out decay prediction by the multi-power law (fitting/curve_law.py), on simulated and on real curves.

Each case fits the law on a trunk's constant-LR curve and its earliest decay (``stable+1 decay``) or two earliest
(``stable+2 decays``), or on the trunk curve alone with the decay parameters of another model size's one-decay fit
(``stable only``, real grids), and predicts the loss at the end of every other decay. Baselines on the same decays:

- ``last stable``: the trunk's loss at the decay start (what a design that ignores decays assumes);
- ``same drop``: that loss times the mean relative drop the fitted decays showed (a decay gains a fixed share).

Real curves (``--train`` retrains them into bench/data/curve_law_<grid>.csv; the CSVs are what a run without it reads):
the project's worker (`run_segment`, DeepSpeed on CPU) trains per size one dense trunk at constant LR and decay
branches from it to 10% of the peak LR, validation loss every few steps, read back from the MLflow run each segment
logged into (``GRIDS``):

- micro (~3 min on 2 cores): 2 layers, d_model 32 and 64, 320 steps of 8×64 tokens after 16 warmup steps; decays at
  step 160 linear to 200, at 240 cosine to 300, at 320 1-sqrt to 400 and at 320 linear to 356; every 8 steps;
- demo (~5 min): sweeps/examples/demo.yaml's dense side (nano, 2×48, micro; 16×128 tokens a step, LR 3e-3, 10 warmup
  steps) with its D1 budgets of 60, 120 and 240 steps, each decayed linearly over its last 10%; every 6 steps.

Simulation: curves from a *different* law, so the fit is not circular: L = E + A·S1^−a + K·m(t), where m is an
exponential moving average of the LR (time constant τ steps): SGD's noise floor proportional to the LR, relaxing
after a drop; 0.3% log-normal noise per point. Schedules are the paper's shapes: a constant trunk to 12,000 steps,
decays of 10% and 20% of the run, linear, cosine and 1-sqrt, branched at 4,000 to 10,000 steps; the fitted decays
branch at 2,000 (to 2,500) and 3,000 (to 4,000).

    .venv/bin/python bench/curve_law.py            # every case, real curves from the CSVs
    .venv/bin/python bench/curve_law.py --train    # retrain the real grids first
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from upscale.fitting.curve_law import DECAY_PARAMS, MULTI_POWER, Curve, fit_curves, predict
from upscale.fitting.fit import FitResult

FINAL = 0.1  # the decays end at 10% of the peak LR


@dataclass(frozen=True)
class Grid:
    """Real curves to train: per size, one dense trunk at constant LR and decay branches (start, end, shape) from it,
    in steps; validation loss every ``eval_every`` steps."""

    name: str
    sizes: dict[str, dict]  # label -> ModelSpec shape fields
    context: int
    batch_size: int
    lr: float
    warmup: int
    trunk_end: int
    decays: tuple[tuple[int, int, str], ...]
    eval_every: int
    eval_tokens: int

    @property
    def csv(self) -> Path:
        return Path(__file__).parent / "data" / f"curve_law_{self.name}.csv"


GRIDS = (
    Grid("micro", {"d32": dict(n_layer=2, d_model=32, n_head=2), "d64": dict(n_layer=2, d_model=64, n_head=2)},
         context=64, batch_size=8, lr=3e-3, warmup=16, trunk_end=320,
         decays=((160, 200, "linear"), (240, 300, "cosine"), (320, 400, "1-sqrt"), (320, 356, "linear")),
         eval_every=8, eval_tokens=64 * 64),
    # sweeps/examples/demo.yaml's dense side: its sizes, batch, LR, warmup and its D1 budgets (60, 120, 240 steps)
    # decayed over their last 10%, linearly
    Grid("demo", {"nano": dict(n_layer=2, d_model=32, n_head=2), "d48": dict(n_layer=2, d_model=48, n_head=4),
                  "micro": dict(n_layer=2, d_model=64, n_head=4)},
         context=128, batch_size=16, lr=3e-3, warmup=10, trunk_end=216,
         decays=((54, 60, "linear"), (108, 120, "linear"), (216, 240, "linear")), eval_every=6, eval_tokens=16384),
)


def wsd(end: int, warmup: int, decay_start: int | None, shape: str = "linear", peak: float = 1.0) -> np.ndarray:
    """The LR of steps 1..end, as workers/schedule.py computes it with one token per step."""
    from upscale.sweeps.segments import ScheduleSpec
    from upscale.workers.schedule import lr_multiplier

    sched = ScheduleSpec(warmup_tokens=warmup, decay_shape=shape, final_lr_fraction=FINAL)
    return peak * np.array([lr_multiplier(s, sched, decay_start, end) for s in range(1, end + 1)])


# --- real curves -------------------------------------------------------------------------------------------------

def train(grid: Grid) -> None:
    """Train ``grid`` with the worker and write every curve's LR per step and validation losses to its CSV."""
    from upscale.sweeps.segments import DataSpec, ModelSpec, OptimSpec, ScheduleSpec, SegmentRuntime, SegmentSpec
    from upscale.workers.segment import run_segment
    from upscale.workers.tracking import client_for, ensure_experiment

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        client = client_for(uri)
        exp = ensure_experiment(client, f"{tmp}/artifacts")
        for label, shape in grid.sizes.items():
            model = ModelSpec(**shape, vocab_size=256, context=grid.context)
            tps = grid.batch_size * grid.context
            base = dict(model=model, data=DataSpec(eval_tokens=grid.eval_tokens),
                        optim=OptimSpec(lr=grid.lr, batch_size=grid.batch_size))

            def run(spec: SegmentSpec, parents: dict[str, str], name: str, tps: int = tps) -> tuple[str, object]:
                run_id = client.create_run(exp, run_name=name).info.run_id
                rt = SegmentRuntime(checkpoint_dir=f"{tmp}/{spec.id}", data_cache_dir=f"{tmp}/cache",
                                    eval_every_tokens=grid.eval_every * tps, mlflow_tracking_uri=uri,
                                    mlflow_run_id=run_id, parent_checkpoints=parents)
                return run_id, run_segment(spec, rt)

            branches = tuple(sorted({d[0] * tps for d in grid.decays if d[0] < grid.trunk_end}))
            trunk = SegmentSpec(kind="dense_trunk", **base, schedule=ScheduleSpec(warmup_tokens=grid.warmup * tps),
                                end_tokens=grid.trunk_end * tps, save_at_tokens=branches)
            run_id, result = run(trunk, {}, f"trunk {label}")
            curves = {"trunk": (run_id, wsd(grid.trunk_end, grid.warmup, None, peak=grid.lr))}
            for start, end, shape_name in grid.decays:
                sched = ScheduleSpec(warmup_tokens=grid.warmup * tps, decay_shape=shape_name, final_lr_fraction=FINAL)
                spec = SegmentSpec(kind="dense_decay", **base, schedule=sched, start_tokens=start * tps,
                                   end_tokens=end * tps, decay_start_tokens=start * tps, parent_ids=(trunk.id,))
                name = f"{shape_name}@{start}-{end}"
                ckpt = result.branch_checkpoints.get(start * tps, result.checkpoint)
                curves[name] = (run(spec, {trunk.id: str(ckpt)}, name)[0],
                                wsd(end, grid.warmup, start, shape_name, peak=grid.lr))
            for name, (rid, lr) in curves.items():
                val = {m.step // tps: m.value for m in client.get_metric_history(rid, "loss/val")}
                rows += [{"size": label, "curve": name, "step": s, "lr": lr[s - 1], "loss": val.get(s, np.nan)}
                         for s in range(1, len(lr) + 1)]
    grid.csv.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(grid.csv, index=False)


def _curve(df: pd.DataFrame, since: int = 0) -> Curve:
    seen = df[df["loss"].notna() & (df["step"] >= since)]
    return Curve(df["lr"].to_numpy(), seen["step"].to_numpy(), seen["loss"].to_numpy())


def real_cases(grid: Grid) -> list[dict]:
    """Per size: fit on the trunk and its earliest decay, or its two earliest; then the trunk alone with the decay
    parameters of the next size's one-decay fit."""
    data = pd.read_csv(grid.csv)
    by = {size: {c: g.sort_values("step") for c, g in d.groupby("curve")}
          for size, d in data.groupby("size", sort=False)}
    out, fits = [], {}
    for size, curves in by.items():
        trunk = _curve(curves["trunk"], since=grid.warmup + 1)
        earliest = sorted((c for c in curves if c != "trunk"), key=_span)
        for k, mode in ((1, "stable+1 decay"), (2, "stable+2 decays")):
            seen = [trunk, *(_curve(curves[c], since=_span(c)[0]) for c in earliest[:k])]
            fit = fit_curves(seen)
            fits.setdefault(size, fit)
            out += _score(f"{grid.name} {size}", mode, fit.params, curves, earliest[:k],
                          (fit_rms(fit.params, seen), at_edges(fit)))
    sizes = list(by)
    for size, other in zip(sizes, sizes[1:] + sizes[:1], strict=True):
        curves = by[size]
        trunk = _curve(curves["trunk"], since=grid.warmup + 1)
        fit = fit_curves([trunk], fixed={k: fits[other].params[k] for k in DECAY_PARAMS})
        fitted = sorted((c for c in by[other] if c != "trunk"), key=_span)[:1]
        out += _score(f"{grid.name} {size}", f"stable only (decay params of {other})", fit.params, curves, fitted,
                      (fit_rms(fit.params, [trunk]), at_edges(fit)), reference=by[other])
    return out


def _span(decay: str) -> tuple[int, int]:
    """(decay start, end) of a decay curve's name, e.g. "cosine@240-300"."""
    start, end = decay.split("@")[1].split("-")
    return int(start), int(end)


def _score(source: str, mode: str, params: dict, curves: dict[str, pd.DataFrame], fitted: list[str],
           fit: tuple[float, str],
           reference: dict[str, pd.DataFrame] | None = None) -> list[dict]:
    """Error at every decay end but the fitted ones (all of them when the fitted decays are ``reference``'s, another
    model's), with the baselines; ``same drop`` is the fitted decays' mean relative drop."""
    ref = reference or curves
    ref_trunk = ref["trunk"].set_index("step")["loss"]
    drop = float(np.mean([ref[c]["loss"].dropna().iloc[-1] / ref_trunk.loc[_span(c)[0]] for c in fitted]))
    trunk_loss = curves["trunk"].set_index("step")["loss"]
    rows = []
    for name, df in curves.items():
        if name == "trunk" or (reference is None and name in fitted):
            continue
        start, end = _span(name)
        true = float(df.set_index("step").loc[end, "loss"])
        pred = float(predict(params, Curve(df["lr"].to_numpy(), [end]))[0])
        rows.append(_row(source, mode, name, true, pred, float(trunk_loss.loc[start]), drop, fit))
    return rows


def at_edges(fit: FitResult) -> str:
    """The free parameters the fit left at or beyond an edge of their box: what the curves did not pin down."""
    edges = [p.name for p in MULTI_POWER.params if p.name in fit.free
             and not p.bounds[0] * (1 + 1e-6) + 1e-9 < fit.params[p.name] < p.bounds[1] * (1 - 1e-6)]
    return ",".join(edges) or "-"


def fit_rms(params: dict, curves: list[Curve]) -> float:
    """RMS relative residual of the law on the points it was fitted to: the noise the held-out errors compare with."""
    r = np.concatenate([predict(params, c) / c.loss - 1 for c in curves])
    return float(np.sqrt(np.mean(r ** 2)))


def _row(source: str, mode: str, decay: str, true: float, pred: float, start_loss: float, drop: float,
         fit: tuple[float, str]) -> dict:
    return {"source": source, "fit on": mode, "held-out decay": decay, "fit rms": fit[0], "at edges": fit[1],
            "true": true, "law": pred,
            "law rel": pred / true - 1, "last stable rel": start_loss / true - 1,
            "same drop rel": start_loss * drop / true - 1}


# --- simulation ----------------------------------------------------------------------------------------------------

SIM_TRUTH = {"E": 2.0, "A": 4.0, "a": 0.3, "K": 0.25, "tau": 300.0}
SIM_WARMUP, SIM_END = 200, 12000


def noise_floor_law(lr: np.ndarray, steps: np.ndarray, rng: np.random.Generator, t: dict = SIM_TRUTH) -> np.ndarray:
    """L = E + A·S1^−a + K·EMA_τ(η), with 0.3% log-normal noise: a generating law that is not the multi-power law."""
    ema = np.empty_like(lr)
    m = 0.0
    for i, eta in enumerate(lr):
        m += (eta - m) / t["tau"]
        ema[i] = m
    area = np.cumsum(lr)
    clean = t["E"] + t["A"] * area[steps - 1] ** -t["a"] + t["K"] * ema[steps - 1]
    return clean * np.exp(rng.normal(0.0, 0.003, steps.size))


def sim_cases(seed: int = 0) -> list[dict]:
    """Fit on the trunk up to step 10,000 and one decay (2,000 -> 2,500, linear) or two (and 3,000 -> 4,000), predict
    18 decays of the paper's shapes; ``same drop`` takes the mean relative drop of the fitted decays."""
    rng = np.random.default_rng(seed)
    trunk_lr = wsd(SIM_END, SIM_WARMUP, None)
    steps = np.arange(SIM_WARMUP + 20, SIM_END + 1, 20)
    trunk = Curve(trunk_lr, steps, noise_floor_law(trunk_lr, steps, rng))
    trunk_loss = dict(zip(steps, trunk.loss, strict=True))
    fit_trunk = Curve(trunk_lr, steps[steps <= 10000], trunk.loss[steps <= 10000])

    def decay(start: int, end: int) -> Curve:
        lr, at = wsd(end, SIM_WARMUP, start), np.arange(start + 10, end + 1, 10)
        return Curve(lr, at, noise_floor_law(lr, at, rng))

    fitted = {(2000, 2500): decay(2000, 2500), (3000, 4000): decay(3000, 4000)}
    held = []
    for start in (4000, 6000, 10000):
        for frac in (0.1, 0.2):
            end = round(start / (1 - frac) / 20) * 20
            for shape in ("linear", "cosine", "1-sqrt"):
                lr = wsd(end, SIM_WARMUP, start, shape)
                held.append((f"{shape}@{start}-{end}", lr, start, float(noise_floor_law(lr, np.array([end]), rng)[0])))
    rows = []
    for mode, keys in (("stable+1 decay", [(2000, 2500)]), ("stable+2 decays", list(fitted))):
        seen = [fit_trunk, *(fitted[k] for k in keys)]
        fit = fit_curves(seen)
        quality = (fit_rms(fit.params, seen), at_edges(fit))
        drop = float(np.mean([fitted[k].loss[-1] / trunk_loss[k[0]] for k in keys]))
        for name, lr, start, true in held:
            pred = float(predict(fit.params, Curve(lr, [lr.size]))[0])
            rows.append(_row("simulated", mode, name, true, pred, trunk_loss[start], drop, quality))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", action="store_true", help="retrain the real grids into bench/data/curve_law_*.csv")
    args = ap.parse_args()
    rows = sim_cases()
    for grid in GRIDS:
        if args.train or not grid.csv.exists():
            train(grid)
        rows += real_cases(grid)
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    summary = table.groupby(["source", "fit on"])[["law rel", "last stable rel", "same drop rel"]].agg(
        lambda s: np.mean(np.abs(s)))
    summary["fit rms"] = table.groupby(["source", "fit on"])["fit rms"].first()
    summary["at edges"] = table.groupby(["source", "fit on"])["at edges"].first()
    summary["decays"] = table.groupby(["source", "fit on"]).size()
    print("\nmean |relative error| of the held-out decay ends (fit rms: the law's own residuals where it was fitted; "
          "at edges: free parameters the fit left at an edge of their box)")
    print(summary.to_string(formatters={c: "{:.2%}".format for c in summary.columns if "rel" in c or "rms" in c}))


if __name__ == "__main__":
    main()
