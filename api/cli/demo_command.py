"""`upscale demo`: the main job end to end on embedded defaults (what `make demo` runs).

It runs sweeps/examples/demo.yaml for real: embedded Ray, the SQLite store and the MLflow store under UPSCALE_HOME.
That means dense trunks and their decay branches, upcycling (naive and Drop-Upcycling), MoE trunks and branches, and
MoEs from scratch. Then it fits the laws the paper's way: E shared by the dense and from-scratch laws, then fixed in
the upcycled `joint` fit, with a cluster bootstrap over trunks. It prints D* with intervals and a verdict per method,
writes the plots and says how to open the MLflow UI on the runs. A second run reuses every trained segment.

`--synthetic` skips training and fits the bundled SYNTHETIC tables instead (generated from the paper's Table 2
parameters with noise, fitting/data/README.md), at the paper's scale, in seconds. Both run the service's analysis
(api/analyses.py `run_analysis`, fitting/analysis.py's ``analyze``) and record it in the store, where `upscale
decide` and `upscale dstar` find it; `upscale analyze SWEEP_ID` prints the same for any sweep.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from upscale.api.cli.analysis_view import print_problems, print_scratch, print_upcycled
from upscale.api.cli.app import app, console
from upscale.api.cli.fit_commands import workers_for
from upscale.api.cli.progress import stage_bars
from upscale.sweeps.spec import DEMO_SPEC

if TYPE_CHECKING:
    import pandas as pd

    from upscale.api.services import Services
    from upscale.fitting.analysis import Analysis, UpcycledAnalysis

# The synthetic tables are at the paper's scale: D* at its sizes, verdicts for a small sunk cost and a 7B model.
PAPER_N1 = (1e8, 1e9, 7e9)
PAPER_DECISIONS = ((1e9, 1e9, 1e9), (7e9, 2e12, 4e11))
BAND_POINTS = 8  # model sizes on the D*(N1) plot


def analyse(services: Services, sweep_ids: list[str], n_boot: int, tables: dict[str, pd.DataFrame] | None = None,
            n1s: list[float] | None = None, decisions: list[tuple[float, float, float]] | None = None) -> Analysis:
    """The shared analysis (api/analyses.py `run_analysis`, trigger demo) with a bar per stage, recorded in the
    store where `upscale decide` and `upscale dstar` find it; identical inputs reuse the analysis already made."""
    from upscale.api.analyses import run_analysis
    from upscale.api.auth import LOCAL_OWNER
    from upscale.fitting.analysis import Analysis

    with stage_bars() as progress:
        record = run_analysis(services, sweep_ids, n1s=n1s, bootstrap=n_boot, owner=LOCAL_OWNER, trigger="demo",
                              progress=progress, tables=tables, decisions=decisions, workers=workers_for(n_boot))
    console.print(f"analysis {record.id} recorded in the store: `upscale decide` and `upscale dstar` use the newest",
                  soft_wrap=True, highlight=False)
    return Analysis.from_json(record.record)


def plot_group(analysis: Analysis, up: UpcycledAnalysis, upcycled: pd.DataFrame, out_dir: Path) -> list[str]:
    """The demo's plots of one upcycling group in ``out_dir`` (fit diagnostics, alpha(D1), D*(N1) with its band,
    catch-up curves); notes for the plots the grid is too small for."""
    import numpy as np

    from upscale.fitting import plots
    from upscale.fitting.bootstrap import percentile_interval
    from upscale.fitting.diagnostics import alpha_d1
    from upscale.fitting.dstar import crossings, dstar_samples
    from upscale.fitting.errors import FitError

    moe, fit, n1s = analysis.scratch.fitted, up.fit.fitted, analysis.n1s
    band_n1 = np.geomspace(min(n1s) / 10, max(n1s) * 10, BAND_POINTS)
    central = np.array([crossings(moe, fit, n).dstar for n in band_n1])
    bands = (np.array([percentile_interval(dstar_samples(moe, fit, n)) for n in band_n1])
             if fit.samples is not None else None)
    d1s = sorted({d["d1"] for d in up.decisions} | {float(upcycled["D1"].median())})
    span = (float(upcycled["D2"].min()) / 10, float(upcycled["D2"].max()) * 1e3)
    drawings = {
        "upcycled_parity": lambda p: plots.parity(fit, upcycled, p),
        "upcycled_residuals": lambda p: plots.residuals(fit, upcycled, p),
        "upcycled_loss_vs_d2": lambda p: plots.loss_vs_d2(fit, upcycled, p),
        "alpha_d1": lambda p: plots.alpha_diagnostics(alpha_d1(upcycled, E=analysis.E), p),
        "dstar": lambda p: plots.dstar_band(band_n1, central, None if bands is None else bands[:, 0],
                                           None if bands is None else bands[:, 1], up.dstar["closed_form"], p),
        "catch_up": lambda p: plots.catch_up_curves(moe, fit, list(n1s), d1s, p, tokens=span),
    }
    paths, skipped = [], []
    for name, draw in drawings.items():
        try:
            paths.append(str(draw(out_dir / f"{name}.png")))
        except FitError as e:  # a diagnostic the grid is too small for (e.g. alpha(D1) needs 3+ D2 per D1)
            skipped.append(f"{name}: {e}")
    console.print(f"plots: {', '.join(paths)}")
    for note in skipped:
        console.print(f"[yellow]plot skipped[/] {note}", highlight=False)
    return paths


def _synthetic(out_dir: Path, n_boot: int) -> None:
    from upscale.api.services import Services
    from upscale.fitting.data import read_table
    from upscale.fitting.synthetic import E_TABLE2, TABLE2, bundled_path
    from upscale.orchestrator.settings import get_settings

    console.print("[bold yellow]SYNTHETIC data[/]: losses generated from the paper's Table 2 parameters with noise "
                  "(fitting/data/README.md), not measurements.")
    tables = {kind: read_table(bundled_path(name)) for kind, name in
              (("dense", "dense"), ("scratch", "moe"), ("upcycled", "upcycled"))}
    analysis = analyse(Services.open(get_settings(), auth=False), [], n_boot, tables, list(PAPER_N1),
                       list(PAPER_DECISIONS))
    console.print(f"generating value of E: {E_TABLE2}")
    print_scratch(analysis, TABLE2["moe"])
    (up,) = analysis.upcycled
    print_upcycled(up, TABLE2["upcycled"])
    plot_group(analysis, up, tables["upcycled"], out_dir)


def _sweep(spec_path: Path, out_dir: Path, n_boot: int) -> None:
    from upscale.api.analyses import sweep_tables
    from upscale.api.cli.run_commands import run_sweep
    from upscale.api.services import Services
    from upscale.fitting.groups import upcycled_groups
    from upscale.sweeps.spec import load_spec

    spec = load_spec(spec_path)
    orch, outcome = run_sweep(spec, str(spec_path))
    console.print(f"sweep {outcome.sweep_id}: {len(outcome.trained)} segment(s) trained this run (the rest reused), "
                  f"{outcome.wall_s:.0f} s wall")
    services = Services(orch, auth=False)
    tables = sweep_tables(services, [outcome.sweep_id])
    analysis = analyse(services, [outcome.sweep_id], n_boot, tables)
    print_scratch(analysis)
    methods = [up.group.get("method") for up in analysis.upcycled]
    for up, (_, rows) in zip(analysis.upcycled, upcycled_groups(tables["upcycled"]), strict=True):
        console.rule(f"[bold]upcycling method: {up.label}")
        print_upcycled(up)
        method = str(up.group.get("method"))
        folder = method if methods.count(up.group.get("method")) == 1 else up.label.replace(" ", "_")
        plot_group(analysis, up, rows, out_dir / folder)
    print_problems(analysis)
    console.print(f"the observations: upscale observations {outcome.sweep_id} --csv", soft_wrap=True)
    # `upscale ui` runs MLflow through this interpreter: a bare `mlflow` is on PATH only with the venv activated
    console.print("the runs in the MLflow UI: upscale ui --launch, then http://127.0.0.1:5000", soft_wrap=True)


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
