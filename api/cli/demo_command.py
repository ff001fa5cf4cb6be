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
    print_plots,
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


def draw_plots(analysis: Analysis, tables: dict[str, pd.DataFrame], out_dir: Path) -> None:
    """Every plot of the analysis in ``out_dir`` (fitting/analysis_plots.py); one warning line per plot skipped."""
    from upscale.fitting.analysis_plots import draw_analysis

    print_plots(draw_analysis(analysis, tables, out_dir), out_dir)


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
    draw_plots(analysis, tables, out_dir)
    _record(Store(get_settings().db_url), analysis, [], "upscale demo --synthetic")


def _sweep(spec_path: Path, out_dir: Path, n_boot: int) -> None:
    from upscale.api.cli.run_commands import run_sweep
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
    for up in analysis.upcycled:
        console.rule(f"[bold]upcycling method: {up.label}")
        _print_upcycled(up)
    draw_plots(analysis, tables, out_dir)
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
