"""`upscale analyze SWEEP_ID` (or `--tables DIR`): the paper's analysis of a sweep's observations, as the service
keeps it, or of observation tables trained anywhere.

A sweep is one code path through `connect` (api/cli/local.py): in-process `analyze` runs control/analyses.py
`run_analysis` on this machine's store (a bar per stage; identical inputs give the analysis already made); with
`--api` the server runs it (POST /sweeps/{id}/analysis). `--export-tables DIR` then writes the tables that analysis
fitted (with curves, the predicted decay ends too, marked), which `--tables DIR` reads back to the same answer.

Tables (`--tables DIR` with dense.csv, scratch.csv and upcycled.csv, and expanded.csv for expert upcycling when it
has any, or `--dense/--scratch/--upcycled`) run
``upscale.analyze`` here, the same analysis function, and are stored nowhere. Either way it prints its settings
(control/analysis_settings.py), for a sweep the newest stored analysis of it made with other settings and the D* that
gave, then what `upscale demo` prints (api/cli/analysis_view.py) or, with --json, the record as the API shows it.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from upscale.api.cli.app import CommandError, console, err_console
from upscale.api.cli.fit_commands import JsonOpt, print_json
from upscale.api.cli.local import ApiOpt, Local, TokenOpt, connect
from upscale.control.schemas import DEFAULT_ANALYSIS_BOOTSTRAP, MAX_BOOTSTRAP

if TYPE_CHECKING:
    import pandas as pd

    from upscale.client import Client

KINDS = ("dense", "scratch", "upcycled")  # the tables, and their file names in a --tables folder (KIND.csv)
EXPANDED = "expanded"  # the optional fourth table of a --tables folder: runs trained after an expert expansion


def analyze_command(
    sweep: Annotated[str | None, typer.Argument(help="Sweep id (`upscale status` lists them); or give tables "
                                                "instead (--tables, or --dense, --scratch and --upcycled).")] = None,
    n1: Annotated[list[float] | None, typer.Option("--n1", help="Dense size N1 to find D* at (repeatable; default: "
                                                   "the sweep's sizes).")] = None,
    bootstrap: Annotated[int, typer.Option(min=0, max=MAX_BOOTSTRAP, help="Cluster-bootstrap refits per fit (0: no "
                                           "intervals, no probability).")] = DEFAULT_ANALYSIS_BOOTSTRAP,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the bootstrap's resampling.")] = 0,
    plot: Annotated[Path | None, typer.Option("--plot", help="Copy the analysis's plots into this folder.")] = None,
    curves: Annotated[bool, typer.Option("--curves/--no-curves", help="Fit the decay ends the sweep's trunk curves "
                                         "predict beside the observed ones (when it has curves; in tables, the rows "
                                         "marked source=predicted); --no-curves: observed decays only.")] = True,
    tables: Annotated[Path | None, typer.Option("--tables", help="Analyse the tables in this folder instead of a "
                                                "sweep: dense.csv, scratch.csv and upcycled.csv, and expanded.csv "
                                                "when there is one (README, 'Bring your own runs').")] = None,
    dense: Annotated[Path | None, typer.Option("--dense", help="The dense table instead of a sweep (columns D, N, "
                                               "loss[, trunk]); with --scratch and --upcycled.")] = None,
    scratch: Annotated[Path | None, typer.Option("--scratch", help="The from-scratch MoE table (D, N = N1, "
                                                 "loss[, trunk]).")] = None,
    upcycled: Annotated[Path | None, typer.Option("--upcycled", help="The upcycled table (D1, D2, N1, loss[, trunk, "
                                                  "method, r, n_expert, topk]).")] = None,
    export_tables: Annotated[Path | None, typer.Option("--export-tables", help="Write the tables the sweep's "
                                                       "analysis fitted into this folder, as --tables reads them.")]
    = None,
    details: Annotated[bool, typer.Option("--details", help="After the summary, each fit, every D* with both "
                                          "intervals and its law forms, the verdicts and every problem.")] = False,
    as_json: JsonOpt = False,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """The paper's analysis of a sweep, or of your own tables: the from-scratch MoE law with E shared with the
    dense law, the upcycled law per upcycling group, D* per N1 with its interval and closed form, verdicts, and what
    the grid cannot identify (with what to add). A sweep's is stored; the service runs it by itself when a sweep
    finishes, and identical inputs give the analysis already made."""
    paths = _table_paths(tables, dense, scratch, upcycled)
    if (paths is None) == (sweep is None):
        raise CommandError("give a sweep id or tables (--tables DIR, or --dense, --scratch and --upcycled), "
                           "not both" if sweep is not None else "give a sweep id (`upscale sweeps` lists them) or "
                           "tables: --tables DIR, or --dense, --scratch and --upcycled")
    if plot is not None:
        plot.mkdir(parents=True, exist_ok=True)
    if paths is not None:
        if api is not None or export_tables is not None:
            raise CommandError(f"{'--api' if api is not None else '--export-tables'} is for a sweep; tables are "
                               f"analysed here")
        _analyze_tables(paths, n1, bootstrap, seed, curves, plot, as_json, details)
        return
    assert sweep is not None  # checked above
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
        if export_tables is not None:
            _export(c, sweep, out, export_tables)
        differing = None if as_json else _other_settings(c, sweep, out)
    out["plots"] = list(out["plots"])  # their names: URLs from a server, files here
    if as_json:
        print_json(out)
        return
    from upscale.api.cli.analysis_view import print_analysis, print_record_header
    from upscale.fitting.analysis import Analysis

    print_record_header(out)
    if differing:
        console.print(f"[yellow]{differing}[/]", highlight=False, soft_wrap=True)
    print_analysis(Analysis.from_json(out["analysis"]), details)
    if plot is not None:
        console.print(f"plots: {len(out['plots'])} in {plot}/" if out["plots"] else "no plots in this analysis")


def _table_paths(folder: Path | None, dense: Path | None, scratch: Path | None,
                 upcycled: Path | None) -> dict[str, Path] | None:
    """The three tables' files from --tables or the three options (None when neither was given); CommandError
    naming what is missing."""
    given = {k: p for k, p in zip(KINDS, (dense, scratch, upcycled), strict=True) if p is not None}
    if folder is None:
        if given and len(given) < len(KINDS):
            missing = ", ".join(f"--{k}" for k in KINDS if k not in given)
            raise CommandError(f"--dense, --scratch and --upcycled go together: missing {missing}")
        return given or None
    if given:
        raise CommandError("give --tables DIR or --dense, --scratch and --upcycled, not both")
    if not folder.is_dir():
        raise CommandError(f"--tables {folder}: no such folder (it holds dense.csv, scratch.csv and upcycled.csv)")
    paths = {k: folder / f"{k}.csv" for k in KINDS}
    missing = [p.name for p in paths.values() if not p.is_file()]
    if missing:
        raise CommandError(f"--tables {folder}: no {', '.join(missing)} there (it needs dense.csv, scratch.csv and "
                           f"upcycled.csv; `upscale analyze SWEEP --export-tables DIR` writes them)")
    expanded = folder / f"{EXPANDED}.csv"  # expert upcycling, when there is any (docs/laws.md, "Expansion")
    return paths | ({EXPANDED: expanded} if expanded.is_file() else {})


def _analyze_tables(paths: dict[str, Path], n1s: list[float] | None, bootstrap: int, seed: int, curves: bool,
                    plot: Path | None, as_json: bool, details: bool) -> None:
    """``upscale.analyze`` of the tables with a bar per stage, printed as a sweep's analysis is (not stored)."""
    import upscale
    from upscale.api.cli.analysis_view import print_analysis
    from upscale.api.cli.fit_commands import print_plots
    from upscale.api.cli.progress import stage_bars, workers_for

    with stage_bars() as progress:
        analysis = upscale.analyze(paths, n1s, bootstrap=bootstrap, seed=seed, workers=workers_for(bootstrap),
                                   progress=progress, curves=curves)
    names: list[str] = []
    if plot is not None:
        from upscale.fitting.analysis_plots import draw_analysis

        drawn = draw_analysis(analysis, {k: upscale.read_observations(p) for k, p in paths.items()}, plot)
        names = drawn.names
        print_plots(drawn, plot, to_stdout=not as_json)
    if as_json:
        print_json({"source": analysis.settings["source"], "analysis": analysis.to_json(), "plots": names})
        return
    console.print("analysis of tables, run here and not stored", highlight=False, soft_wrap=True)
    print_analysis(analysis, details)


def fitted_tables(observed: dict[str, pd.DataFrame], record: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """The tables an analysis (``record``, its JSON) fitted, from the ``observed`` tables it read: those alone, or,
    when it fitted decay ends predicted from trunk curves, with those rows appended, marked and weighted as it
    weighted them (fitting/evidence.py `with_predicted`, from the point noise it recorded)."""
    import pandas as pd

    from upscale.fitting.curve_observations import PredictedDecays
    from upscale.fitting.evidence import with_predicted
    from upscale.fitting.laws import WEIGHT

    curves = record.get("curves") or {}
    if not curves.get("rows"):
        return observed
    predicted = {k: pd.DataFrame(rows).drop(columns=WEIGHT) for k, rows in curves["rows"].items()}
    return with_predicted(observed, PredictedDecays(predicted), curves["noise"]["point_sd"])


def _export(c: Local | Client, sweep: str, out: dict[str, Any], folder: Path) -> None:
    """dense.csv, scratch.csv and upcycled.csv in ``folder``: the tables the sweep's analysis ``out`` fitted, so
    that `--tables` reads back the same answer."""
    import io

    import pandas as pd

    observed = {k: pd.read_csv(io.StringIO(c.observations_csv(sweep, k))) for k in KINDS}
    folder.mkdir(parents=True, exist_ok=True)
    for kind, df in fitted_tables(observed, out["analysis"]).items():
        with (folder / f"{kind}.csv").open("w") as f:
            f.write(f"# {kind} observations of sweep {sweep}, as its analysis {out['id']} fitted them (upscale "
                    f"analyze {sweep} --export-tables)\n")
            df.to_csv(f, index=False)
    err_console.print(f"tables of analysis {out['id']} written to {folder}/ ({', '.join(f'{k}.csv' for k in KINDS)}):"
                      f" `upscale analyze --tables {folder}` analyses them", soft_wrap=True, highlight=False)


def _other_settings(c: Local | Client, sweep: str, out: dict[str, Any]) -> str | None:
    """The line naming the newest stored analysis of the sweep made with other settings, and its D*."""
    from upscale.api.cli.analysis_view import other_settings_text

    return other_settings_text(out, c.analyses(sweep))
