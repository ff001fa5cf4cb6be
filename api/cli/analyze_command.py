"""`upscale analyze SWEEP_ID`: the paper's analysis of a sweep's observations, as the service keeps it.

It is one code path through `connect` (api/cli/local.py): in-process `analyze` runs control/analyses.py
`run_analysis` on this machine's store (a bar per stage; identical inputs give the analysis already made); with
`--api` the server runs it (POST /sweeps/{id}/analysis). Either way it prints what `upscale demo` prints
(api/cli/analysis_view.py) or, with --json, the stored analysis as the API shows it (plots: their names).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer

from upscale.api.cli.app import console, err_console
from upscale.api.cli.fit_commands import JsonOpt, print_json
from upscale.api.cli.local import ApiOpt, Local, TokenOpt, connect
from upscale.control.schemas import DEFAULT_ANALYSIS_BOOTSTRAP, MAX_BOOTSTRAP


def analyze_command(
    sweep: Annotated[str, typer.Argument(help="Sweep id (`upscale status` lists them).")],
    n1: Annotated[list[float] | None, typer.Option("--n1", help="Dense size N1 to find D* at (repeatable; default: "
                                                   "the sweep's sizes).")] = None,
    bootstrap: Annotated[int, typer.Option(min=0, max=MAX_BOOTSTRAP, help="Cluster-bootstrap refits per fit (0: no "
                                           "intervals, no probability).")] = DEFAULT_ANALYSIS_BOOTSTRAP,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the bootstrap's resampling.")] = 0,
    plot: Annotated[Path | None, typer.Option("--plot", help="Copy the analysis's plots into this folder.")] = None,
    curves: Annotated[bool, typer.Option("--curves/--no-curves", help="Fit the decay ends the sweep's trunk curves "
                                         "predict beside the observed ones (when it has curves); --no-curves: "
                                         "observed decays only.")] = True,
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
    with connect(api, token) as c:
        # in-process: a bar per stage (Local.analyze); a server answers once done, meanwhile a spinner
        busy = nullcontext() if isinstance(c, Local) else err_console.status(
            f"the server at {api} is analysing sweep {sweep}…")
        with busy:
            out = c.analyze(sweep, n1s=n1, bootstrap=bootstrap, seed=seed, curves=curves)
        if plot is not None:
            for name in out["plots"]:  # each drawn as PNG and PDF (fitting/plots.py FORMATS)
                (plot / name).parent.mkdir(parents=True, exist_ok=True)
                for suffix in (".png", ".pdf"):
                    (plot / f"{name}{suffix}").write_bytes(c.analysis_plot(sweep, f"{name}{suffix}", out["id"]))
    out["plots"] = list(out["plots"])  # their names: URLs from a server, files here
    if as_json:
        print_json(out)
        return
    from upscale.api.cli.analysis_view import print_analysis, print_record_header

    print_record_header(out)
    print_analysis(Analysis.from_json(out["analysis"]))
    if plot is not None:
        console.print(f"plots: {len(out['plots'])} in {plot}/" if out["plots"] else "no plots in this analysis")
