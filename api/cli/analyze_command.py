"""`upscale analyze SWEEP_ID`: the paper's analysis of a sweep's observations, as the service keeps it.

In-process it runs control/analyses.py `run_analysis` on this machine's store (a bar per stage; identical inputs give
the analysis already made); with `--api` the server runs it (POST /sweeps/{id}/analysis). Either way it prints
what `upscale demo` prints (api/cli/analysis_view.py) or, with --json, the stored record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from upscale.api.cli.app import CommandError, app, console, err_console
from upscale.api.cli.fit_commands import JsonOpt, print_json, workers_for
from upscale.api.cli.serve_commands import ApiOpt, TokenOpt
from upscale.control.schemas import DEFAULT_ANALYSIS_BOOTSTRAP, MAX_BOOTSTRAP


def _local(sweep: str, n1s: list[float] | None, bootstrap: int, seed: int, plot: Path | None) -> dict[str, Any]:
    from upscale.api.cli.analysis_view import copy_plots
    from upscale.api.cli.progress import stage_bars
    from upscale.control.analyses import NotReady, public_json, run_analysis
    from upscale.control.services import LOCAL_OWNER, Services
    from upscale.orchestrator.settings import get_settings

    services = Services.open(get_settings(), auth=False)
    try:
        with stage_bars() as progress:
            record = run_analysis(services, [sweep], n1s=n1s, bootstrap=bootstrap, seed=seed, owner=LOCAL_OWNER,
                                  trigger="request", progress=progress, workers=workers_for(bootstrap))
    except NotReady as e:  # no finished segments yet: a user's timing, not a bug
        raise CommandError(str(e)) from None
    if plot is not None:
        copy_plots(record, services.settings.home, plot)
    return public_json(record)


def _remote(api: str, token: str | None, sweep: str, n1s: list[float] | None, bootstrap: int, seed: int,
            plot: Path | None) -> dict[str, Any]:
    from upscale.client import Client

    with Client(api, token) as c, err_console.status(f"the server at {api} is analysing sweep {sweep}…"):
        out = c.analyze(sweep, n1s=n1s, bootstrap=bootstrap, seed=seed)
        if plot is not None:
            for name in out["plots"]:
                (plot / name).parent.mkdir(parents=True, exist_ok=True)
                (plot / f"{name}.png").write_bytes(c.analysis_plot(sweep, f"{name}.png", out["id"]))
    out["plots"] = list(out["plots"])
    return out


@app.command("analyze")
def analyze_command(
    sweep: Annotated[str, typer.Argument(help="Sweep id (`upscale status` lists them).")],
    n1: Annotated[list[float] | None, typer.Option("--n1", help="Dense size N1 to find D* at (repeatable; default: "
                                                   "the sweep's sizes).")] = None,
    bootstrap: Annotated[int, typer.Option(min=0, max=MAX_BOOTSTRAP, help="Cluster-bootstrap refits per fit (0: no "
                                           "intervals, no probability).")] = DEFAULT_ANALYSIS_BOOTSTRAP,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the bootstrap's resampling.")] = 0,
    plot: Annotated[Path | None, typer.Option("--plot", help="Copy the analysis's plots into this folder.")] = None,
    as_json: JsonOpt = False,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """The paper's analysis of a sweep: the from-scratch MoE law with E shared with the dense law, the upcycled law
    per upcycling group, D* per N1 with its interval and closed form, verdicts, and what the grid cannot identify
    (with what to add). Stored in the store; the service runs it by itself when a sweep finishes, and identical
    inputs give the analysis already made."""
    from upscale.fitting.analysis import Analysis

    if plot is not None:
        plot.mkdir(parents=True, exist_ok=True)
    out = (_remote(api, token, sweep, n1, bootstrap, seed, plot) if api
           else _local(sweep, n1, bootstrap, seed, plot))
    if as_json:
        print_json(out)
        return
    from upscale.api.cli.analysis_view import print_analysis, print_record_header

    print_record_header(out)
    print_analysis(Analysis.from_json(out["analysis"]))
    if plot is not None:
        console.print(f"plots: {len(out['plots'])} in {plot}/" if out["plots"] else "no plots in this analysis")
