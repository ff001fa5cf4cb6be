"""`upscale demo`: the main job end to end on embedded defaults (what `make demo` runs).

Until the sweep pipeline produces real observations, the demo fits the bundled SYNTHETIC tables (generated from the
paper's Table 2 parameters with noise, fitting/data/README.md) the way the paper does: E shared by the dense and
MoE laws, then fixed in the upcycled `joint` fit; cluster bootstrap over trunks; D* with intervals; a verdict;
plots in <home>/demo. ``fit_demo`` is the reusable part: give it other tables (e.g. a finished sweep's) and it
runs the same analysis.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from api.cli.app import app, console
from api.cli.fit_commands import decision_text, dstar_results, dstar_table, fmt, progress_bar, workers_for

if TYPE_CHECKING:
    import pandas as pd

DEMO_N1 = (1e8, 1e9, 7e9)  # dense sizes whose D* the demo reports
DEMO_DECISIONS = ((1e9, 1e9, 1e9), (7e9, 2e12, 4e11))  # (N1, D1, D2): a small sunk cost, and Llama-2-7B-like
BAND_N1 = 8  # model sizes on the D*(N1) plot


def fit_demo(tables: dict[str, pd.DataFrame], out_dir: Path, n_boot: int = 200) -> dict[str, Any]:
    """Fit dense+MoE with a shared E, then the upcycled law with E fixed; D*, verdicts and plots.

    ``tables`` has "dense" and "moe" (columns D, N, loss[, trunk]) and "upcycled" (D1, D2, N1, loss[, trunk]).
    Returns the fitted reports, D* results, decisions and the plot paths.
    """
    import numpy as np

    from fitting import plots
    from fitting.bootstrap import percentile_interval
    from fitting.diagnostics import alpha_d1
    from fitting.dstar import crossings, decide, dstar_samples
    from fitting.fit import fit_shared
    from fitting.laws import get_law
    from fitting.summary import FittedLaw, report

    chin, joint = get_law("chinchilla"), get_law("joint")
    shared = fit_shared({"dense": (chin, tables["dense"]), "moe": (chin, tables["moe"])}, shared=("E",))
    E = shared.params["E"]
    with progress_bar(2 * n_boot, "bootstrap") as advance:
        w = workers_for(n_boot)
        moe_rep, moe_boot = report(chin, tables["moe"], {"E": E}, n_boot, workers=w, progress=advance)
        up_rep, up_boot = report(joint, tables["upcycled"], {"E": E}, n_boot, workers=w, progress=advance)
    moe = FittedLaw(chin, moe_rep["params"], moe_boot.samples if moe_boot else None)
    up = FittedLaw(joint, up_rep["params"], up_boot.samples if up_boot else None)
    dstar = dstar_results(moe, up, list(DEMO_N1))
    decisions = [decide(moe, up, *case).to_json() for case in DEMO_DECISIONS]

    band_n1 = np.geomspace(1e8, 1e11, BAND_N1)
    central = np.array([crossings(moe, up, n).dstar for n in band_n1])
    bands = np.array([percentile_interval(dstar_samples(moe, up, n)) for n in band_n1]) if moe_boot else None
    paths = [
        plots.parity(up, tables["upcycled"], out_dir / "upcycled_parity.png"),
        plots.residuals(up, tables["upcycled"], out_dir / "upcycled_residuals.png"),
        plots.loss_vs_d2(up, tables["upcycled"], out_dir / "upcycled_loss_vs_d2.png"),
        plots.alpha_diagnostics(alpha_d1(tables["upcycled"], E=E), out_dir / "alpha_d1.png"),
        plots.dstar_band(band_n1, central, None if bands is None else bands[:, 0],
                         None if bands is None else bands[:, 1], dstar["closed_form"], out_dir / "dstar.png"),
        plots.catch_up_curves(moe, up, [1e9, 7e9, 70e9], [1e10, 1e11, 1e12], out_dir / "catch_up.png"),
    ]
    return {"shared_E": E, "moe": moe_rep, "upcycled": up_rep, "dstar": dstar, "decisions": decisions,
            "plots": [str(p) for p in paths]}


def _params_table(title: str, rep: dict[str, Any], truth: dict[str, float]) -> Table:
    table = Table("param", "fitted", "95% interval", "generating value", title=title)
    for k, v in rep["params"].items():
        lo, hi = rep["ci"].get(k, [None, None])
        ci = f"[{fmt(lo)}, {fmt(hi)}]" if k in rep["ci"] else "(fixed: shared E)"
        table.add_row(k, fmt(v), ci, fmt(truth.get(k)))
    table.caption = f"{rep['n_points']} points · LOO RMS {fmt(rep['loo_rms'])} (loss units)"
    return table


@app.command("demo")
def demo_command(
    out: Path | None = typer.Option(None, "--out", help="Plot folder (default <UPSCALE_HOME>/demo)."),
) -> None:
    """Fit the bundled SYNTHETIC tables, print the laws, D* with intervals and a verdict; plots to .upscale/demo."""
    from fitting.data import read_table
    from fitting.synthetic import TABLE2, bundled_path

    start = time.perf_counter()
    out_dir = out or Path(os.environ.get("UPSCALE_HOME", ".upscale")) / "demo"
    console.print("[bold yellow]SYNTHETIC data[/]: losses generated from the paper's Table 2 parameters with noise "
                  "(fitting/data/README.md), not measurements.")
    tables = {k: read_table(bundled_path(k)) for k in ("dense", "moe", "upcycled")}
    res = fit_demo(tables, out_dir)
    console.print(f"shared E (dense + MoE fitted jointly): {res['shared_E']:.4f}  (generating value 0.165)")
    console.print(_params_table("MoE from scratch (chinchilla on D, N = N1)", res["moe"], TABLE2["moe"]))
    console.print(_params_table("upcycled (joint, Eq. 12)", res["upcycled"], TABLE2["upcycled"]))
    console.print(dstar_table(res["dstar"]))
    for d in res["decisions"]:
        console.print(f"N1={fmt(d['n1'])}, D1={fmt(d['d1'])}, D2={fmt(d['d2'])}: " + decision_text(d))
    console.print(f"plots: {', '.join(res['plots'])}")
    console.print(f"[dim]SYNTHETIC demo done in {time.perf_counter() - start:.1f} s[/]")
