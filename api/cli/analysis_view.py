"""How the CLI prints an analysis (fitting/analysis.py's record): its settings, then the summary a researcher reads in
ten seconds (fitting/display.py: what the runs show, D* and how far it is projected, the backtest, the runs to add) and
the problems one line per kind and fit; with ``details``, the shared E, the from-scratch fit, per upcycling group its
fit, D* table and verdicts, every problem with what to add, and per expansion study the same. `upscale demo` and
`upscale analyze` print through here, so both show the same thing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from upscale.api.cli.app import console
from upscale.api.cli.fit_commands import decision_text, fit_table, fmt, interval_text, print_dstar
from upscale.fitting.display import curves_lines, problem_groups, settings_text, summary_lines

if TYPE_CHECKING:
    from pathlib import Path

    from upscale.control.records import AnalysisRecord
    from upscale.fitting.analysis import Analysis, ExpansionAnalysis, UpcycledAnalysis
    from upscale.fitting.plots import DrawnPlots


def print_scratch(analysis: Analysis, truth: dict[str, float] | None = None) -> None:
    """The shared E with its bootstrap intervals (and, given the generating parameters, whether E's lies in them),
    then the from-scratch fit."""
    ivs = analysis.E_bootstrap.get("intervals") or {}
    shown = f" (80% {interval_text(ivs.get('80'))}, 95% {interval_text(ivs.get('95'))})" if ivs else ""
    console.print(f"shared E (dense + MoE fitted jointly): {analysis.E:.4f}{shown}", highlight=False)
    if truth is not None and ivs.get("95"):
        iv, true_E = ivs["95"], truth["E"]
        inside = (iv["low_open"] or iv["low"] <= true_E) and (iv["high_open"] or true_E <= iv["high"])
        colour = "green" if inside else "yellow"
        console.print(f"[{colour}]the generating E={true_E:g} is {'inside' if inside else 'outside'} E's 95% "
                      f"interval[/]", highlight=False)
    if analysis.E_note:
        console.print(f"[yellow]{analysis.E_note}[/]", highlight=False)
    if analysis.scratch is not None:
        console.print(fit_table(analysis.scratch.report, "MoE from scratch (chinchilla on D, N = N1)", truth))


def print_upcycled(up: UpcycledAnalysis, truth: dict[str, float] | None = None) -> None:
    if up.fit is not None:
        console.print(fit_table(up.fit.report, "upcycled (joint, Eq. 12)", truth))
    if up.dstar is not None:
        print_dstar(up.dstar)
    for d in up.decisions:
        console.print(f"N1={fmt(d['n1'])}, D1={fmt(d['d1'])}, D2={fmt(d['d2'])}: " + decision_text(d))


def print_trained(analysis: Analysis) -> None:
    """The ranges the analysis was trained on (every answer's extrapolation is measured against them), and the
    decays predicted from trunk curves that were fitted beside the observed ones."""
    for table, columns in analysis.trained.items():
        spans = ", ".join(f"{c} {fmt(lo)}–{fmt(hi)}" for c, (lo, hi) in columns.items())
        console.print(f"[dim]trained ({table}): {spans}[/]", highlight=False)
    for line in curves_lines(analysis.curves):
        console.print(line, highlight=False, soft_wrap=True)


def print_problems(analysis: Analysis) -> None:
    """Each problem of the analysis: a law it could not fit or identify, an unhealthy fit; which, why, and what to
    add to the grid. None: a green line saying so."""
    if not analysis.problems:
        console.print("[green]no problems: every fit is healthy[/]")
    for p in analysis.problems:
        add = f"; add {p['add']}" if p["add"] else ""
        console.print(f"[yellow]{p['fit']} ({p['law']}): {p['why']}{add}[/]", highlight=False, soft_wrap=True)


def print_settings(analysis: Analysis) -> None:
    """What the analysis was asked with, first: two answers for the same data differ only by these."""
    console.print(settings_text(analysis.settings), highlight=False, soft_wrap=True)


def print_summary(analysis: Analysis) -> None:
    """The ten-second answer (a contradiction between the laws and the runs in yellow), then the problems one line
    per kind and fit with a count."""
    record = analysis.to_json()
    for line in summary_lines(record):
        colour = ("yellow" if "contradicts the runs" in line
                  else "bold" if line.startswith(("upscale", "Expansion")) else "")
        console.print(f"[{colour}]{line}[/]" if colour else line, highlight=False, soft_wrap=True, markup=bool(colour))
    for line in problem_groups(record.get("problems") or []):
        console.print(f"    {line}", style="yellow", highlight=False, soft_wrap=True, markup=False)


def print_analysis(analysis: Analysis, details: bool = False, truth: dict[str, dict[str, float]] | None = None) -> None:
    """The analysis: its settings and summary; with ``details`` the trained ranges, the from-scratch fit, each group
    under its own rule and every problem (``truth``: the generating parameters, "moe" and "upcycled", to compare
    the fits with)."""
    print_settings(analysis)
    print_summary(analysis)
    if not details:
        console.print("[dim]--details: each fit, every D* with both intervals and its law forms, the verdicts, and "
                      "every problem with what to add[/]")
        return
    console.rule("[bold]detail")
    print_trained(analysis)
    print_scratch(analysis, (truth or {}).get("moe"))
    for up in analysis.upcycled:
        console.rule(f"[bold]upcycling method: {up.label or 'all'}")
        print_upcycled(up, (truth or {}).get("upcycled"))
    print_problems(analysis)
    for study in analysis.expansions:
        console.rule(f"[bold]{study.label}")
        print_expansion(study)


def print_expansion(study: ExpansionAnalysis) -> None:
    """One expansion study's detail: its arms' fits, D*_expand, verdicts and problems; or what it lacks."""
    if study.analysis is None:
        for m in study.missing:
            console.print(f"[yellow]{m['arm']}: {m['why']}" + (f"; add {m['add']}" if m["add"] else "") + "[/]",
                          highlight=False, soft_wrap=True)
        return
    inner = study.analysis
    print_trained(inner)
    console.print(f"shared E (parent + MoE from scratch): {inner.E:.4f}", highlight=False)
    if inner.scratch is not None:
        console.print(fit_table(inner.scratch.report, "MoE from scratch (chinchilla on D, N = N1)"))
    for up in inner.upcycled:
        print_upcycled(up)
    print_problems(inner)


def print_record_header(record: dict[str, Any]) -> None:
    """Which analysis this is (the stored row as `public_json` gives it)."""
    sweeps = ", ".join(record["sweep_ids"]) or "no sweep"
    console.print(f"analysis {record['id']} of sweep {sweeps} ({record['trigger']}, {record['created_at'][:19]}; "
                  f"bootstrap {record['params']['bootstrap']}, seed {record['params']['seed']})", highlight=False,
                  soft_wrap=True)


def _setting(name: str, value: Any) -> str:
    """One compared setting as "bootstrap 100", "N1 2e+04, 3e+04", "curves on"."""
    if name == "n1s":
        return "N1 " + (", ".join(fmt(n) for n in value or []) or "–")
    if name == "curves":
        return f"curves {'on' if value else 'off'}"
    return f"{name.replace('_', ' ')} {value}"


def dstar_brief(record: dict[str, Any], limit: int = 3) -> str:
    """The record's D* per group and N1, the first ``limit`` of them, as "D* naive 4x2 at N1 2e+04: 1.2e+07"."""
    found = [f"{up.get('label') or 'all'} at N1 {fmt(r['n1'])}: {fmt(r.get('dstar'))}"
             for up in record.get("upcycled") or [] for r in (up.get("dstar") or {}).get("results", [])]
    more = f" (+{len(found) - limit} more)" if len(found) > limit else ""
    return "D* " + ("; ".join(found[:limit]) or "none") + more


def other_settings_text(record: dict[str, Any], others: list[dict[str, Any]]) -> str | None:
    """One line naming the newest of ``others`` (stored analyses of the same sweep, as the API lists them, newest
    first) whose settings differ from ``record``'s: which settings, and the D* it gave beside this one's."""
    from upscale.control.analysis_settings import differences

    ours = (record.get("analysis") or {}).get("settings") or {}
    for other in others:
        theirs = (other.get("analysis") or {}).get("settings")
        if other["id"] == record["id"] or other["status"] != "done" or not theirs or not ours:
            continue
        changed = differences(ours, theirs)
        if changed:
            what = ", ".join(f"{_setting(k, a)} (here {_setting(k, b)})" for k, (a, b) in changed.items())
            return (f"analysis {other['id']} of this sweep ({other['trigger']}, {other['created_at'][:19]}) used "
                    f"other settings: {what}; it gave {dstar_brief(other['analysis'])} (here "
                    f"{dstar_brief(record['analysis']).removeprefix('D* ')})")
    return None


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
