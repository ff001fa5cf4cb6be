"""`upscale demo`: the main job end to end on embedded defaults (what `make demo` runs).

It runs sweeps/examples/demo.yaml for real: embedded Ray, the SQLite store and the MLflow store under UPSCALE_HOME.
That means dense trunks and their decay branches, upcycling (naive and Drop-Upcycling), MoE trunks and branches, and
MoEs from scratch. Then it fits the laws the paper's way: E shared by the dense and from-scratch laws, then fixed in
the upcycled `joint` fit, with a cluster bootstrap over trunks. It prints D* with intervals and a verdict per method,
writes the plots and says how to open the MLflow UI on the runs. A second run reuses every trained segment.

`--synthetic` skips training and fits the bundled SYNTHETIC tables instead (generated from the paper's Table 2
parameters with noise, fitting/data/README.md), at the paper's scale, in seconds. ``fit_scratch`` and ``fit_demo``
are the analysis both share; the from-scratch side is fitted once, whatever the number of upcycling methods.
"""

from __future__ import annotations

import time
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

from upscale.api.cli.app import app, console
from upscale.api.cli.fit_commands import (
    decision_text,
    dstar_table,
    fit_table,
    fmt,
    progress_bar,
    workers_for,
)

if TYPE_CHECKING:
    import pandas as pd

    from upscale.fitting.summary import FittedLaw

DEMO_SPEC = Path(str(files("upscale.sweeps") / "examples" / "demo.yaml"))
# The synthetic tables are at the paper's scale: D* at its sizes, verdicts for a small sunk cost and a 7B model.
PAPER_N1 = (1e8, 1e9, 7e9)
PAPER_DECISIONS = ((1e9, 1e9, 1e9), (7e9, 2e12, 4e11))
BAND_POINTS = 8  # model sizes on the D*(N1) plot


class ScratchFit(NamedTuple):
    """The from-scratch side of the analysis: the same for every upcycling method, so fitted once."""

    E: float
    E_note: str  # why E was fixed rather than fitted, if it was
    report: dict[str, Any]
    law: FittedLaw


def fit_scratch(tables: dict[str, pd.DataFrame], n_boot: int) -> ScratchFit:
    """E shared by the dense and from-scratch laws (fitted jointly), then the from-scratch law with E fixed.

    ``tables`` has "dense" and "moe" (columns D, N, loss[, trunk]).
    """
    from upscale.fitting.errors import FitError
    from upscale.fitting.fit import fit_shared
    from upscale.fitting.laws import get_law
    from upscale.fitting.summary import FittedLaw, report, report_steps

    chin = get_law("chinchilla")
    try:
        pair = {"dense": (chin, tables["dense"]), "moe": (chin, tables["moe"])}
        E, note = fit_shared(pair, shared=("E",)).params["E"], ""
    except FitError as e:  # a small grid may not pin E down: the fit drives it to 0; say so and carry on
        E = chin.param("E").bounds[0]
        note = f"E is not identified by this grid ({e}); fixed at {E:g}, the low end of its plausible range"
    with progress_bar(report_steps(tables["moe"], n_boot), "LOO, bootstrap (from scratch)") as advance:
        rep, boot = report(chin, tables["moe"], {"E": E}, n_boot, workers=workers_for(n_boot), progress=advance)
    return ScratchFit(E, note, rep, FittedLaw(chin, rep["params"], boot.samples if boot else None))


def fit_demo(scratch: ScratchFit, upcycled: pd.DataFrame, out_dir: Path, n1s: list[float],
             decisions: list[tuple[float, float, float]], n_boot: int = 200) -> dict[str, Any]:
    """The upcycled law with the shared E fixed; D* at ``n1s``, ``decisions`` for (N1, D1, D2) cases, and the plots
    in ``out_dir``. ``upcycled`` has columns D1, D2, N1, loss[, trunk].
    """
    import numpy as np

    from upscale.fitting import plots
    from upscale.fitting.bootstrap import percentile_interval
    from upscale.fitting.diagnostics import alpha_d1
    from upscale.fitting.dstar import crossings, decide, dstar_results, dstar_samples
    from upscale.fitting.errors import FitError
    from upscale.fitting.laws import get_law
    from upscale.fitting.summary import FittedLaw, report, report_steps

    joint, moe, E = get_law("joint"), scratch.law, scratch.E
    with progress_bar(report_steps(upcycled, n_boot), "LOO, bootstrap (upcycled)") as advance:
        up_rep, up_boot = report(joint, upcycled, {"E": E}, n_boot, workers=workers_for(n_boot), progress=advance)
    up = FittedLaw(joint, up_rep["params"], up_boot.samples if up_boot else None)
    dstar = dstar_results(moe, up, list(n1s), (min(n1s) / 10, max(n1s) * 10))
    verdicts = [decide(moe, up, *case).to_json() for case in decisions]

    band_n1 = np.geomspace(min(n1s) / 10, max(n1s) * 10, BAND_POINTS)
    central = np.array([crossings(moe, up, n).dstar for n in band_n1])
    bands = np.array([percentile_interval(dstar_samples(moe, up, n)) for n in band_n1]) if up_boot else None
    d1s = sorted({case[1] for case in decisions} | {float(upcycled["D1"].median())})
    span = (float(upcycled["D2"].min()) / 10, float(upcycled["D2"].max()) * 1e3)
    drawings = {
        "upcycled_parity": lambda p: plots.parity(up, upcycled, p),
        "upcycled_residuals": lambda p: plots.residuals(up, upcycled, p),
        "upcycled_loss_vs_d2": lambda p: plots.loss_vs_d2(up, upcycled, p),
        "alpha_d1": lambda p: plots.alpha_diagnostics(alpha_d1(upcycled, E=E), p),
        "dstar": lambda p: plots.dstar_band(band_n1, central, None if bands is None else bands[:, 0],
                                           None if bands is None else bands[:, 1], dstar["closed_form"], p),
        "catch_up": lambda p: plots.catch_up_curves(moe, up, list(n1s), d1s, p, tokens=span),
    }
    paths, skipped = [], []
    for name, draw in drawings.items():
        try:
            paths.append(str(draw(out_dir / f"{name}.png")))
        except FitError as e:  # a diagnostic the grid is too small for (e.g. alpha(D1) needs 3+ D2 per D1)
            skipped.append(f"{name}: {e}")
    return {"upcycled": up_rep, "dstar": dstar, "decisions": verdicts, "plots": paths, "skipped_plots": skipped}


def _print_scratch(scratch: ScratchFit, truth: dict[str, float] | None = None) -> None:
    console.print(f"shared E (dense + MoE fitted jointly): {scratch.E:.4f}")
    if scratch.E_note:
        console.print(f"[yellow]{scratch.E_note}[/]", highlight=False)
    console.print(fit_table(scratch.report, "MoE from scratch (chinchilla on D, N = N1)", truth))


def _print_upcycled(res: dict[str, Any], truth: dict[str, float] | None = None) -> None:
    console.print(fit_table(res["upcycled"], "upcycled (joint, Eq. 12)", truth))
    console.print(dstar_table(res["dstar"]))
    for d in res["decisions"]:
        console.print(f"N1={fmt(d['n1'])}, D1={fmt(d['d1'])}, D2={fmt(d['d2'])}: " + decision_text(d))
    console.print(f"plots: {', '.join(res['plots'])}")
    for note in res["skipped_plots"]:
        console.print(f"[yellow]plot skipped[/] {note}", highlight=False)


def _synthetic(out_dir: Path, n_boot: int) -> None:
    from upscale.fitting.data import read_table
    from upscale.fitting.synthetic import E_TABLE2, TABLE2, bundled_path

    console.print("[bold yellow]SYNTHETIC data[/]: losses generated from the paper's Table 2 parameters with noise "
                  "(fitting/data/README.md), not measurements.")
    tables = {k: read_table(bundled_path(k)) for k in ("dense", "moe", "upcycled")}
    scratch = fit_scratch(tables, n_boot)
    console.print(f"generating value of E: {E_TABLE2}")
    _print_scratch(scratch, TABLE2["moe"])
    _print_upcycled(fit_demo(scratch, tables["upcycled"], out_dir, list(PAPER_N1), list(PAPER_DECISIONS), n_boot),
                    TABLE2["upcycled"])


def _sweep(spec_path: Path, out_dir: Path, n_boot: int) -> None:
    from upscale.api.cli.run_commands import run_sweep
    from upscale.orchestrator.observations import table
    from upscale.sweeps.spec import load_spec

    spec = load_spec(spec_path)
    orch, outcome = run_sweep(spec, str(spec_path))
    console.print(f"sweep {outcome.sweep_id}: {len(outcome.trained)} segment(s) trained this run (the rest reused), "
                  f"{outcome.wall_s:.0f} s wall")
    obs = orch.store.observations(outcome.sweep_id)
    dense, scratch, upcycled = (table(obs, k) for k in ("dense", "scratch", "upcycled"))
    n1s = sorted(float(n) for n in dense["N"].unique())
    fitted_scratch = fit_scratch({"dense": dense, "moe": scratch}, n_boot)
    _print_scratch(fitted_scratch)
    for method, rows in upcycled.groupby("method", sort=False):
        label = method if rows["r"].isna().all() else f"{method} r={rows['r'].iloc[0]:g}"
        console.rule(f"[bold]upcycling method: {label}")
        biggest = (n1s[-1], float(rows["D1"].max()), float(rows["D2"].max()))
        smallest = (n1s[0], float(rows["D1"].min()), float(rows["D2"].min()))
        _print_upcycled(fit_demo(fitted_scratch, rows.reset_index(drop=True), out_dir / str(method), n1s,
                                 [smallest, biggest], n_boot))
    console.print(f"the observations: upscale observations {outcome.sweep_id} --csv", soft_wrap=True)
    console.print(f"the runs in the MLflow UI: mlflow ui --backend-store-uri {orch.settings.mlflow_tracking_uri}",
                  soft_wrap=True)  # never wrapped: people paste it


@app.command("demo")
def demo_command(
    spec: Annotated[Path, typer.Option(help="Sweep spec to run (default: the bundled demo, 2 CPU cores, minutes).")]
    = DEMO_SPEC,
    synthetic: Annotated[bool, typer.Option("--synthetic", help="Skip training: fit the bundled SYNTHETIC tables "
                                            "(paper-scale, generated from Table 2) in seconds.")] = False,
    bootstrap: Annotated[int, typer.Option(min=0, help="Cluster-bootstrap refits for the intervals.")] = 200,
    out: Annotated[Path | None, typer.Option(help="Plot folder (default <UPSCALE_HOME>/demo).")] = None,
) -> None:
    """Run the demo sweep for real, fit the dense, from-scratch and upcycled laws, print D* and a verdict, plot."""
    from upscale.orchestrator.settings import get_settings

    start = time.perf_counter()
    out_dir = out or Path(get_settings().home) / "demo"
    if synthetic:
        _synthetic(out_dir, bootstrap)
    else:
        _sweep(spec, out_dir, bootstrap)
    console.print(f"[dim]demo done in {time.perf_counter() - start:.1f} s[/]")
