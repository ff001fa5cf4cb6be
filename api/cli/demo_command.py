"""`upscale demo`: the main job end to end on embedded defaults (what `make demo` runs).

It runs sweeps/examples/demo.yaml for real: embedded Ray, the SQLite store and the MLflow store under UPSCALE_HOME.
That means dense trunks and their decay branches, upcycling (naive and Drop-Upcycling), MoE trunks and branches, and
MoEs from scratch. Then it fits the laws the paper's way: E shared by the dense and from-scratch laws, then fixed in
the upcycled `joint` fit, with a cluster bootstrap over trunks. It prints D* with intervals and a verdict per method,
writes the plots and says how to open the MLflow UI on the runs. A second run reuses every trained segment.

`--synthetic` skips training and fits the bundled SYNTHETIC tables instead (generated from the paper's Table 2
parameters with noise, fitting/data/README.md), at the paper's scale, in seconds. Both run fitting/analysis.py's
``analyze`` and record its fits in the store, where `upscale decide` and `upscale dstar` find them.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from upscale.api.cli.app import app, console
from upscale.api.cli.fit_commands import (
    decision_text,
    dstar_table,
    fit_table,
    fmt,
    workers_for,
)
from upscale.sweeps.spec import DEMO_SPEC

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pandas as pd

    from upscale.api.records import FitRecord
    from upscale.fitting.analysis import Analysis, Progress, UpcycledAnalysis
    from upscale.orchestrator.store import Store

# The synthetic tables are at the paper's scale: D* at its sizes, verdicts for a small sunk cost and a 7B model.
PAPER_N1 = (1e8, 1e9, 7e9)
PAPER_DECISIONS = ((1e9, 1e9, 1e9), (7e9, 2e12, 4e11))
BAND_POINTS = 8  # model sizes on the D*(N1) plot


@contextmanager
def stage_bars() -> Iterator[Progress]:
    """One rich bar per stage of the analysis, on stderr; yields analyze's ``progress`` callback."""
    from rich.console import Console
    from rich.progress import Progress as Bars

    with Bars(console=Console(stderr=True), transient=True) as bars:
        tasks: dict[str, int] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage, total=total)
            bars.update(tasks[stage], completed=done)

        yield update


def run_analysis(tables: dict[str, pd.DataFrame], n_boot: int, n1s: list[float] | None = None,
                 decisions: list[tuple[float, float, float]] | None = None) -> Analysis:
    from upscale.fitting.analysis import analyze

    with stage_bars() as progress:
        return analyze(tables, n1s, decisions, n_boot, workers=workers_for(n_boot), progress=progress)


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


def _print_scratch(analysis: Analysis, truth: dict[str, float] | None = None) -> None:
    console.print(f"shared E (dense + MoE fitted jointly): {analysis.E:.4f}")
    if analysis.E_note:
        console.print(f"[yellow]{analysis.E_note}[/]", highlight=False)
    console.print(fit_table(analysis.scratch.report, "MoE from scratch (chinchilla on D, N = N1)", truth))


def _print_upcycled(up: UpcycledAnalysis, truth: dict[str, float] | None = None) -> None:
    console.print(fit_table(up.fit.report, "upcycled (joint, Eq. 12)", truth))
    console.print(dstar_table(up.dstar))
    for d in up.decisions:
        console.print(f"N1={fmt(d['n1'])}, D1={fmt(d['d1'])}, D2={fmt(d['d2'])}: " + decision_text(d))


def _record(store: Store, analysis: Analysis, sweep_ids: list[str], source: str) -> None:
    """Keep the analysis's fits in the store: `upscale decide` and `upscale dstar` use the newest ones."""
    from upscale.api.auth import LOCAL_OWNER
    from upscale.api.fits import record_analysis
    from upscale.orchestrator.settings import get_settings

    records = record_analysis(store, get_settings().home, analysis, sweep_ids, owner=LOCAL_OWNER, source=source)
    ids = ", ".join(f"{r.kind} {r.id}" + (f" ({label})" if (label := _group(r)) else "") for r in records)
    console.print(f"fits recorded in the store: {ids}; `upscale decide` and `upscale dstar` use the newest",
                  soft_wrap=True, highlight=False)


def _group(record: FitRecord) -> str:
    """The upcycling group a recorded fit of an analysis is of ("" for the from-scratch one)."""
    from upscale.fitting.groups import group_label

    return group_label(record.request["analysis"]["group"])


def _synthetic(out_dir: Path, n_boot: int) -> None:
    from upscale.fitting.data import read_table
    from upscale.fitting.synthetic import E_TABLE2, TABLE2, bundled_path
    from upscale.orchestrator.settings import get_settings
    from upscale.orchestrator.store import Store

    console.print("[bold yellow]SYNTHETIC data[/]: losses generated from the paper's Table 2 parameters with noise "
                  "(fitting/data/README.md), not measurements.")
    tables = {kind: read_table(bundled_path(name)) for kind, name in
              (("dense", "dense"), ("scratch", "moe"), ("upcycled", "upcycled"))}
    analysis = run_analysis(tables, n_boot, list(PAPER_N1), list(PAPER_DECISIONS))
    console.print(f"generating value of E: {E_TABLE2}")
    _print_scratch(analysis, TABLE2["moe"])
    (up,) = analysis.upcycled
    _print_upcycled(up, TABLE2["upcycled"])
    plot_group(analysis, up, tables["upcycled"], out_dir)
    _record(Store(get_settings().db_url), analysis, [], "upscale demo --synthetic")


def _sweep(spec_path: Path, out_dir: Path, n_boot: int) -> None:
    from upscale.api.cli.run_commands import run_sweep
    from upscale.fitting.groups import upcycled_groups
    from upscale.orchestrator.observations import table
    from upscale.sweeps.spec import load_spec

    spec = load_spec(spec_path)
    orch, outcome = run_sweep(spec, str(spec_path))
    console.print(f"sweep {outcome.sweep_id}: {len(outcome.trained)} segment(s) trained this run (the rest reused), "
                  f"{outcome.wall_s:.0f} s wall")
    obs = orch.store.observations(outcome.sweep_id)
    tables = {kind: table(obs, kind) for kind in ("dense", "scratch", "upcycled")}
    analysis = run_analysis(tables, n_boot)
    _print_scratch(analysis)
    methods = [up.group.get("method") for up in analysis.upcycled]
    for up, (_, rows) in zip(analysis.upcycled, upcycled_groups(tables["upcycled"]), strict=True):
        console.rule(f"[bold]upcycling method: {up.label}")
        _print_upcycled(up)
        method = str(up.group.get("method"))
        folder = method if methods.count(up.group.get("method")) == 1 else up.label.replace(" ", "_")
        plot_group(analysis, up, rows, out_dir / folder)
    _record(orch.store, analysis, [outcome.sweep_id], "upscale demo")
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
