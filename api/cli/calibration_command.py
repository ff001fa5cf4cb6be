"""`upscale calibration SWEEP_ID`: the sweep's prediction ledger (control/ledger.py): how the newest analysis's
predictions for its observations scored, so a user knows whether to trust the D* interval."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from upscale.api.cli.app import console
from upscale.api.cli.local import local_services


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _loss(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def calibration_command(
    sweep: Annotated[str, typer.Argument(help="Sweep id (`upscale sweeps` lists them).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the ledger as JSON (what GET "
                                          "/sweeps/{id}/calibration returns).")] = False,
) -> None:
    """How the analysis's predictions for a sweep scored: before each observation segment trained, the newest
    analysis predicted its loss with 80% and 95% intervals; coverage near 80% and 95% means its intervals (D*'s
    too) can be trusted, far below means they are too narrow."""
    from upscale.control import ledger

    cal = ledger.calibration(local_services().store, sweep)  # an unknown id: NotFoundError, one `error:` line
    if as_json:
        print(json.dumps(cal))
        return
    if not cal["predicted"]:
        console.print(f"sweep {sweep} has no predictions: none of its segments trained while an analysis of it (or of "
                      f"a sweep it extends) existed; extend it after `upscale analyze` to record some")
        return
    table = Table(title=f"sweep {sweep}: predictions scored {cal['scored']} of {cal['predicted']}")
    for name in ("fit", "scored", "inside 80%", "inside 95%", "mean |error|"):
        table.add_column(name)

    def row(name: str, c: dict[str, Any]) -> None:
        table.add_row(name, str(c["scored"]), _share(c["coverage_80"]), _share(c["coverage_95"]), _loss(c["mae"]))

    for law, counts in cal["by_law"].items():
        row(law, counts)
    if len(cal["by_law"]) > 1:
        row("all", cal)
    console.print(table)
    if cal["scored"] >= 10 and cal["coverage_80"] < 0.6:  # fewer scored points say too little
        console.print("[yellow]fewer than 60% of observations fell inside their nominal 80% interval: the analysis's "
                      "intervals are too narrow; treat its D* interval with care[/]")
