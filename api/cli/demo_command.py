"""`upscale demo`: the main job end to end on embedded defaults (what `make demo` runs).

It runs sweeps/examples/demo.yaml for real: embedded Ray, the SQLite store and the MLflow store under UPSCALE_HOME.
That means dense trunks and their decay branches, upcycling (naive and Drop-Upcycling), MoE trunks and branches, and
MoEs from scratch. Then it fits the laws the paper's way: E shared by the dense and from-scratch laws, then fixed in
the upcycled `joint` fit, with a cluster bootstrap over trunks. It prints D* with intervals and a verdict per method,
writes the plots and says how to open the MLflow UI on the runs. A second run reuses every trained segment.

`--synthetic` skips training and fits the bundled SYNTHETIC tables instead (generated from the paper's Table 2
parameters with noise, fitting/data/README.md), at the paper's scale, in seconds. Both run the service's analysis
(control/analyses.py `run_analysis`, fitting/analysis.py's ``analyze``) and record it in the store, where `upscale
decide` and `upscale dstar` find it; `upscale analyze SWEEP_ID` prints the same for any sweep.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from upscale.api.cli.analysis_view import copy_plots, print_analysis
from upscale.api.cli.app import console
from upscale.api.cli.fit_commands import print_plots
from upscale.api.cli.progress import stage_bars, workers_for
from upscale.control.schemas import DEFAULT_ANALYSIS_BOOTSTRAP
from upscale.sweeps.loader import DEMO_SPEC

if TYPE_CHECKING:
    import pandas as pd

    from upscale.control.services import Services
    from upscale.fitting.analysis import Analysis

# The synthetic tables are at the paper's scale: D* at its sizes, verdicts for a small and the largest sunk cost.
PAPER_N1 = (1e8, 1e9, 7e9)
PAPER_DECISIONS = ((1e9, 1e9, 1e9), (1e9, 3e10, 3e10))


def analyse(services: Services, sweep_ids: list[str], n_boot: int, out_dir: Path,
            tables: dict[str, pd.DataFrame] | None = None, n1s: list[float] | None = None,
            decisions: list[tuple[float, float, float]] | None = None) -> Analysis:
    """The shared analysis (control/analyses.py `run_analysis`, trigger demo) with a bar per stage, recorded in the
    store where `upscale decide` and `upscale dstar` find it (identical inputs reuse the analysis already made),
    and its plots copied into ``out_dir``."""
    from upscale.control.analyses import run_analysis
    from upscale.control.services import LOCAL_OWNER
    from upscale.fitting.analysis import Analysis

    with stage_bars() as progress:
        record = run_analysis(services, sweep_ids, n1s=n1s, bootstrap=n_boot, owner=LOCAL_OWNER, trigger="demo",
                              progress=progress, tables=tables, decisions=decisions, workers=workers_for(n_boot))
    console.print(f"analysis {record.id} recorded in the store: `upscale decide` and `upscale dstar` use the newest",
                  soft_wrap=True, highlight=False)
    print_plots(copy_plots(record, services.settings.home, out_dir), out_dir)
    return Analysis.from_json(record.record)


def _synthetic(out_dir: Path, n_boot: int, details: bool) -> None:
    from upscale.api.cli.local import local_services
    from upscale.fitting.data import read_table
    from upscale.fitting.synthetic import TABLE2, bundled_path

    console.print("[bold yellow]SYNTHETIC data[/]: losses generated from the paper's Table 2 parameters with noise "
                  "(fitting/data/README.md), not measurements.")
    tables = {kind: read_table(bundled_path(name)) for kind, name in
              (("dense", "dense"), ("scratch", "moe"), ("upcycled", "upcycled"))}
    analysis = analyse(local_services(), [], n_boot, out_dir, tables, list(PAPER_N1),
                       list(PAPER_DECISIONS))
    print_analysis(analysis, details, truth=TABLE2)


def _sweep(spec_path: Path, out_dir: Path, n_boot: int, details: bool) -> None:
    from upscale.api.cli.run_commands import run_sweep, trained_line
    from upscale.orchestrator.tracking import ui_address
    from upscale.sweeps.loader import load_spec

    spec = load_spec(spec_path)
    services, outcome = run_sweep(spec, str(spec_path))
    console.print(trained_line(services.orch, outcome), highlight=False)
    print_analysis(analyse(services, [outcome.sweep_id], n_boot, out_dir), details)
    console.print(f"the observations: upscale observations {outcome.sweep_id} --csv", soft_wrap=True)
    # `upscale ui` runs MLflow through this interpreter: a bare `mlflow` is on PATH only with the venv activated
    console.print(f"the runs in the MLflow UI: upscale ui --launch, then {ui_address(services.settings)}",
                  soft_wrap=True)


def demo_command(
    spec: Annotated[Path, typer.Option(help="Sweep spec to run (default: the bundled demo, 2 CPU cores, minutes).")]
    = DEMO_SPEC,
    synthetic: Annotated[bool, typer.Option("--synthetic", help="Skip training: fit the bundled SYNTHETIC tables "
                                            "(paper-scale, generated from Table 2) in seconds.")] = False,
    bootstrap: Annotated[int, typer.Option(min=0, help="Cluster-bootstrap refits for the intervals (the default is "
                                           "`upscale analyze`'s and upscale.analyze's).")]
    = DEFAULT_ANALYSIS_BOOTSTRAP,
    out: Annotated[Path | None, typer.Option(help="Plot folder (default <UPSCALE_HOME>/demo).")] = None,
    details: Annotated[bool, typer.Option("--details", help="After the summary, each fit, every D* with both "
                                          "intervals and its law forms, the verdicts and every problem.")] = False,
) -> None:
    """Run the demo sweep for real, fit the dense, from-scratch and upcycled laws, print D* and a verdict, plot."""
    from upscale.orchestrator.settings import get_settings

    start = time.perf_counter()
    out_dir = out or Path(get_settings().home) / "demo"
    if synthetic:
        _synthetic(out_dir, bootstrap, details)
    else:
        _sweep(spec, out_dir, bootstrap, details)
    console.print(f"[dim]demo done in {time.perf_counter() - start:.1f} s[/]")
