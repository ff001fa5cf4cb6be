"""How the CLI prints an analysis (fitting/analysis.py's record): the shared E, the from-scratch fit, per upcycling
group its fit, D* table and verdicts, and the problems (a law the grid cannot identify, why, what to add) as yellow
lines. `upscale demo` and `upscale analyze` print through here, so both show the same thing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from upscale.api.cli.app import console
from upscale.api.cli.fit_commands import decision_text, dstar_table, fit_table, fmt

if TYPE_CHECKING:
    from pathlib import Path

    from upscale.control.records import AnalysisRecord
    from upscale.fitting.analysis import Analysis, UpcycledAnalysis
    from upscale.fitting.plots import DrawnPlots


def print_scratch(analysis: Analysis, truth: dict[str, float] | None = None) -> None:
    console.print(f"shared E (dense + MoE fitted jointly): {analysis.E:.4f}")
    if analysis.E_note:
        console.print(f"[yellow]{analysis.E_note}[/]", highlight=False)
    if analysis.scratch is not None:
        console.print(fit_table(analysis.scratch.report, "MoE from scratch (chinchilla on D, N = N1)", truth))


def print_upcycled(up: UpcycledAnalysis, truth: dict[str, float] | None = None) -> None:
    if up.fit is not None:
        console.print(fit_table(up.fit.report, "upcycled (joint, Eq. 12)", truth))
    if up.dstar is not None:
        console.print(dstar_table(up.dstar))
    for d in up.decisions:
        console.print(f"N1={fmt(d['n1'])}, D1={fmt(d['d1'])}, D2={fmt(d['d2'])}: " + decision_text(d))


def print_problems(analysis: Analysis) -> None:
    """Each law the analysis could not fit or identify: which, why, and what to add to the grid."""
    for p in analysis.problems:
        add = f"; add {p['add']}" if p["add"] else ""
        console.print(f"[yellow]{p['fit']} ({p['law']}): {p['why']}{add}[/]", highlight=False, soft_wrap=True)


def print_analysis(analysis: Analysis) -> None:
    """The whole analysis: from-scratch fit, each group under its own rule, then the problems."""
    print_scratch(analysis)
    for up in analysis.upcycled:
        console.rule(f"[bold]upcycling method: {up.label or 'all'}")
        print_upcycled(up)
    print_problems(analysis)


def print_record_header(record: dict[str, Any]) -> None:
    """Which analysis this is (the stored row as `public_json` gives it)."""
    sweeps = ", ".join(record["sweep_ids"]) or "no sweep"
    console.print(f"analysis {record['id']} of sweep {sweeps} ({record['trigger']}, {record['created_at'][:19]}; "
                  f"bootstrap {record['params']['bootstrap']}, seed {record['params']['seed']})", highlight=False,
                  soft_wrap=True)


def copy_plots(record: AnalysisRecord, home: Path, dest: Path) -> DrawnPlots:
    """The analysis's plots, drawn when it ran (under <home>/analyses/<id>/), copied into ``dest`` (PNG and PDF,
    group folders kept), with the lines of the plots it skipped."""
    import shutil

    from upscale.control.analyses import analysis_dir
    from upscale.fitting.plots import DrawnPlots

    folder = analysis_dir(home, record.id)
    for name in record.plots:
        for suffix in (".png", ".pdf"):
            if (folder / f"{name}{suffix}").exists():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(folder / f"{name}{suffix}", dest / f"{name}{suffix}")
    return DrawnPlots(list(record.plots), list((record.record or {}).get("plots_skipped", [])))
