"""`upscale laws|fit|compare|dstar|decide|optimal`: the fitting library from the command line.

`dstar` and `decide` without fit files answer from the newest analysis through `connect` (api/cli/local.py): in-process
on this machine's store, or with `--api` from that server; one code path either way.

Flags and JSON keys are a contract users script against; everything else (tables, progress) is for
people. numpy, pandas, scipy and the fitting package are imported inside the commands so `upscale --help` is fast.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import TimeElapsedColumn
from rich.table import Table

from upscale.api.cli.app import console, err_console
from upscale.api.cli.local import ApiOpt, TokenOpt, connect
from upscale.api.cli.progress import workers_for
from upscale.fitting import display
from upscale.fitting.display import number as fmt
from upscale.fitting.errors import FitError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from upscale.fitting.analysis import Analysis
    from upscale.fitting.plots import DrawnPlots
    from upscale.fitting.summary import FittedLaw


JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (the scripted contract) instead of tables.")]


def print_json(obj: Any) -> None:
    from upscale.fitting.summary import clean

    print(json.dumps(clean(obj), indent=2, allow_nan=False))


def parse_fixed(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise FitError(f"--fix {item!r}: write NAME=VALUE, e.g. --fix E=0.165")
    return out


@contextmanager
def progress_bar(total: int, label: str) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar with the time left on stderr (so --json stdout stays clean); yields the advance
    callback."""
    if total <= 0:
        yield None
        return
    from rich.progress import Progress

    with Progress(*Progress.get_default_columns(), TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda k: bar.advance(task, k)


def print_plots(drawn: DrawnPlots, folder: Path, to_stdout: bool = True) -> None:
    """Where the plots went (stdout, unless it carries JSON) and one warning line per plot the data cannot support
    (stderr): a skipped diagnostic never fails the command."""
    if to_stdout and drawn.names:
        console.print(f"plots written to {folder}/ (PNG and PDF): {', '.join(drawn.names)}", soft_wrap=True,
                      highlight=False, markup=False)
    for line in drawn.warnings():
        err_console.print(f"warning: {line}", soft_wrap=True, highlight=False, markup=False)


def laws_command() -> None:
    """The registry: one law a line with its formula, the columns it needs and its source in the paper; then the laws
    of loss curves (fitting/curve_law.py), which read a run's LR schedule and losses along it."""
    from upscale.fitting.curve_law import CURVE_LAWS
    from upscale.fitting.laws import LAWS

    width = max(map(len, [*LAWS, *CURVE_LAWS]))
    for name, law in LAWS.items():
        console.print(f"{name:<{width}}  {law.formula}  [dim]columns: {', '.join(law.columns)} · {law.source}[/]",
                      soft_wrap=True, highlight=False)
    for name, curve_law in CURVE_LAWS.items():
        console.print(f"{name:<{width}}  {curve_law.formula}  [dim]reads: the LR of every step and losses along the "
                      f"run · {curve_law.source}[/]", soft_wrap=True, highlight=False)


def fit_table(rep: dict[str, Any], title: str, truth: dict[str, float] | None = None) -> Table:
    """One fit report as a table; ``truth`` adds the generating values of synthetic data (the demo)."""
    table = Table("param", "value", "95% interval", *(("generating value",) if truth else ()), title=title)
    for k, v in rep["params"].items():
        lo, hi = rep["ci"].get(k, [None, None])
        fixed = " (fixed)" if k in rep["fixed"] else ""
        table.add_row(k, fmt(v) + fixed, f"[{fmt(lo)}, {fmt(hi)}]" if k in rep["ci"] else "",
                      *((fmt(truth.get(k)),) if truth else ()))
    table.caption = (f"{rep['n_points']} points · objective {rep['objective']:.4g} · LOO RMS {fmt(rep['loo_rms'])}"
                     + "".join(f"\nwarning: {w}" for w in rep["warnings"]))
    return table


def _groups_table(out: dict[str, Any]) -> Table:
    """One row per group, one column per parameter (value and interval): how each parameter moves across groups."""
    names = list(out["groups"][0]["params"])
    table = Table(*out["by"], *names, "points", "LOO RMS", title=f"{out['law']} by {', '.join(out['by'])}")
    for rep in out["groups"]:
        cells = []
        for k in names:
            lo, hi = rep["ci"].get(k, [None, None])
            cells.append(fmt(rep["params"][k]) + (f"\n[{fmt(lo)}, {fmt(hi)}]" if k in rep["ci"] else ""))
        table.add_row(*(fmt(v) if isinstance(v, float) else str(v) for v in rep["group"].values()), *cells,
                      str(rep["n_points"]), fmt(rep["loo_rms"]))
    table.caption = "".join(f"\n{rep['group']}: warning: {w}" for rep in out["groups"] for w in rep["warnings"])
    return table


def fit_command(
    law: Annotated[str, typer.Option("--law", help="A law of `upscale laws`.")],
    data: Annotated[Path, typer.Option("--data", help="CSV: the law's columns, `loss`, optional `trunk`.")],
    fix: Annotated[list[str] | None, typer.Option("--fix", help="NAME=VALUE, e.g. E=0.165 (repeatable).")] = None,
    by: Annotated[str | None, typer.Option("--by", help="Fit one law per group of these columns, e.g. method,r.")]
    = None,
    bootstrap: Annotated[int, typer.Option("--bootstrap", min=0, help="Bootstrap refits (trunks if present).")] = 0,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the fit's plots (PNG and PDF) to this folder.")]
    = None,
    as_json: JsonOpt = False,
) -> None:
    """Fit a law to a table with summed Huber/BFGS; LOO RMS always, percentile intervals with --bootstrap."""
    from upscale.fitting.data import read_table
    from upscale.fitting.laws import get_law
    from upscale.fitting.summary import group_keys, grouped_report, report, report_steps

    the_law = get_law(law)
    fixed = parse_fixed(fix or [])
    df = read_table(data)
    cols = [c.strip() for c in by.split(",") if c.strip()] if by else []
    n_groups = len(group_keys(df, cols)) if cols else 1
    with progress_bar(report_steps(df, bootstrap * n_groups), "fit, LOO" + (", bootstrap" if bootstrap else "")) \
            as advance:
        w = workers_for(bootstrap)
        if cols:
            out = grouped_report(the_law, df, cols, fixed, bootstrap, workers=w, progress=advance)
            reps = [(g, part) for g, (_, part) in zip(out["groups"], group_keys(df, cols), strict=True)]
        else:
            out, _ = report(the_law, df, fixed, bootstrap, workers=w, progress=advance)
            reps = [(out, df)]
    drawn = None
    if plot is not None:
        from upscale.fitting.plots import DrawnPlots, fit_plots

        drawn = DrawnPlots()
        for rep, part in reps:
            sub = "_".join(f"{k}={v}" for k, v in rep["group"].items()) if "group" in rep else ""
            one = fit_plots(the_law.name, rep, part, plot / sub)
            drawn.names += [f"{sub}/{n}" if sub else n for n in one.names]
            drawn.skipped += [f"{sub}/{line}" if sub else line for line in one.skipped]
    if as_json:
        print_json(out)
    else:
        console.print(_groups_table(out) if cols else fit_table(out, the_law.name))
        for rep, _ in reps:  # the fit's health (fitting/health.py): what is wrong and what to add, in yellow
            where = "".join(f"{k}={v} " for k, v in rep.get("group", {}).items())
            for p in rep["problems"]:
                console.print(f"[yellow]{where}{p['kind']}: {p['why']}; add {p['add']}[/]", highlight=False,
                              soft_wrap=True)
    if drawn is not None:
        print_plots(drawn, plot, to_stdout=not as_json)


def compare_command(
    laws: Annotated[str, typer.Option("--laws", help="Comma-separated laws, e.g. data-mul,data-add.")],
    data: Annotated[Path, typer.Option("--data", help="CSV with every law's columns and `loss`.")],
    as_json: JsonOpt = False,
) -> None:
    """Several laws on one table: LOO RMS and extrapolation error (loss units), AIC, BIC."""
    from upscale.fitting.compare import compare, compare_steps
    from upscale.fitting.data import read_table
    from upscale.fitting.laws import get_law

    the_laws = [get_law(n.strip()) for n in laws.split(",") if n.strip()]
    if not the_laws:
        raise FitError("--laws is empty; give comma-separated names from `upscale laws`")
    df = read_table(data)
    with progress_bar(compare_steps(the_laws, df), "fit, LOO and extrapolation per law") as advance:
        rows = compare(the_laws, df, progress=advance)
    if as_json:
        print_json({"results": [r.to_json() for r in rows]})
        return
    table = Table("law", "points", "free", "loo_rms", "extrapolation", "AIC", "BIC",
                  title="lower is better in every column")
    for r in rows:
        table.add_row(r.law, str(r.n_points), str(r.n_free), fmt(r.loo_rms), fmt(r.extrapolation_rms), fmt(r.aic),
                      fmt(r.bic))
    console.print(table)


StoredHelp = ("Without --moe/--upcycled: the newest analysis (the service's own when a sweep finishes, `upscale "
              "analyze` or `upscale demo`) in this machine's store, or with --api URL on that server.")
GroupOpt = Annotated[str | None, typer.Option("--group", help="Upcycling group of the analysis, as it labels them "
                                              "(e.g. 'naive 8x2'); default: the best one.")]


def _file_pair(moe: Path | None, upcycled: Path | None) -> tuple[FittedLaw, FittedLaw] | None:
    """The two `upscale fit --json` files, or None to use the newest analysis."""
    from upscale.fitting.summary import load_fit

    if moe is not None and upcycled is not None:
        return load_fit(moe), load_fit(upcycled)
    if moe is not None or upcycled is not None:
        raise FitError("give both --moe and --upcycled fit files, or neither to use the newest analysis")
    return None


def _where(api: str | None) -> str:
    from upscale.orchestrator.settings import get_settings

    return f"the server {api}" if api else f"the local store ({get_settings().home})"


def newest_analysis(api: str | None, token: str | None) -> tuple[Analysis, dict[str, Any]]:
    """The newest finished analysis (as GET /analyses lists it), named on stderr: id, sweeps, when."""
    from upscale.fitting.analysis import Analysis

    with connect(api, token) as c:
        done = [a for a in c.analyses() if a["status"] == "done"]  # newest first
    if not done:
        raise FitError(f"no analysis in {_where(api)}: run `upscale analyze SWEEP_ID` on a sweep with finished "
                       f"segments, or `upscale demo` (--synthetic: in seconds), or give --moe and --upcycled files "
                       f"from `upscale fit --json`")
    a = done[0]
    err_console.print(f"analysis {a['id']} of sweep {', '.join(a['sweep_ids']) or '(none: the synthetic demo)'} "
                      f"({a['trigger']}, {str(a['created_at'])[:19]}) from {_where(api)}", soft_wrap=True,
                      highlight=False)
    return Analysis.from_json(a["analysis"]), {"id": a["id"], "sweep_ids": a["sweep_ids"],
                                               "created_at": a["created_at"]}


def group_fits(analysis: Analysis, group: str | None) -> tuple[FittedLaw, FittedLaw, str]:
    """The analysis's from-scratch law and one upcycling group's (``group``, else the first fitted one), with the
    group's label; FitError saying what is missing when it has no such pair."""
    if analysis.scratch is None:
        raise FitError(f"the analysis has no from-scratch MoE law: {analysis.missing('chinchilla')}")
    fitted = [u for u in analysis.upcycled if u.fit is not None and (group is None or u.label == group)]
    if not fitted:
        labels = ", ".join(repr(u.label) for u in analysis.upcycled if u.fit is not None) or "none"
        raise FitError(f"--group {group!r}: the analysis's fitted upcycling groups are {labels}" if group else
                       f"the analysis has no upcycled law: {analysis.missing('joint')}")
    if group is None and len(fitted) > 1:
        err_console.print(f"group {fitted[0].label!r} (also: {', '.join(repr(u.label) for u in fitted[1:])}; "
                          f"--group picks one)", highlight=False)
    return analysis.scratch.fitted, fitted[0].fit.fitted, fitted[0].label


def dstar_command(
    n1: Annotated[list[float], typer.Option("--n1", help="Dense model size N1 (repeatable).")],
    moe: Annotated[Path | None, typer.Option("--moe", help="`upscale fit --json` of the from-scratch MoE (D, N); "
                                             "default: the newest analysis's.")] = None,
    upcycled: Annotated[Path | None, typer.Option("--upcycled", help="`upscale fit --json` of the upcycled law; "
                                                  "default: the newest analysis's.")] = None,
    group: GroupOpt = None,
    api: ApiOpt = None, token: TokenOpt = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Draw D*(N1) with its bootstrap band and closed form, "
                                              "and the catch-up curves at each --n1, in this folder (PNG and PDF).")]
    = None,
    as_json: JsonOpt = False,
) -> None:
    from upscale.fitting.dstar import dstar_results

    pair = _file_pair(moe, upcycled)
    if pair is not None:
        moe_fit, up_fit = pair
        out = dstar_results(moe_fit, up_fit, n1)
    else:
        analysis, ref = newest_analysis(api, token)
        moe_fit, up_fit, label = group_fits(analysis, group)
        out = {**dstar_results(moe_fit, up_fit, n1), "group": label, "analysis": ref}
        analysis.answer_dstars(out["results"], label)  # the answer the analysis and a decision give, not the law's
    if as_json:
        print_json(out)
    else:
        print_dstar(out)
    if plot is not None:
        print_plots(dstar_plots(moe_fit, up_fit, n1, out["closed_form"], plot), plot, to_stdout=not as_json)


# The help of `upscale dstar` (an f-string cannot be a docstring).
dstar_command.__doc__ = ("D*: the token count where MoE from scratch catches up with upcycling at the same sunk cost "
                         f"(Eq. 13). {StoredHelp}")


def dstar_plots(moe: FittedLaw, up: FittedLaw, n1s: list[float], closed_form: dict[str, float] | None,
                out: Path) -> DrawnPlots:
    """`upscale dstar --plot`: D*(N1) over the sizes the fits were trained on (N1_RANGE for fits that do not say),
    widened to every --n1, and the catch-up curves at each N1, for sunk costs a decade below, at and above the
    typical D* (the fits carry no grid of D1)."""
    import numpy as np

    from upscale.fitting import plots
    from upscale.fitting.dstar import N1_RANGE, crossings, n1_span

    drawn = plots.DrawnPlots()
    lo, hi = n1_span(moe, up) or N1_RANGE
    band = np.geomspace(min(lo, *n1s), max(hi, *n1s), 8)
    drawn.attempt(out, "dstar", lambda p: plots.dstar_band([plots.dstar_curve(moe, up, band, "", closed_form)], p))
    finite = [d for d in (crossings(moe, up, n).dstar for n in n1s) if 0 < d < math.inf]
    if not finite:
        drawn.skip("catch_up", "D* is not finite at any --n1 (upcycling always, or never, wins), so there is no "
                               "sunk cost to draw the catch-up at")
        return drawn
    typical = float(np.exp(np.mean(np.log(finite))))
    d1s = [typical / 10, typical, typical * 10]
    span = plots.token_span((moe, up), n1s, typical / 100, typical * 1e3)
    drawn.attempt(out, "catch_up", lambda p: plots.catch_up_curves(moe, up, n1s, d1s, p, span))
    return drawn


def interval_text(iv: dict[str, Any] | None) -> str:
    """An 80% or 95% interval as printed: an open end is "unbounded", never the "—" of a missing value."""
    return escape(display.interval(iv))  # "[unbounded, ...]" is no rich tag


def distance_text(ext: dict[str, Any] | None) -> str:
    """How far an answer lies from the trained ranges, always shown ("inside" when it does not), in yellow past the
    extrapolation factor."""
    text = display.distance(ext)
    return f"[yellow]{text} (extrapolated)[/]" if ext and ext.get("flagged") else text


def flags_text(r: dict[str, Any]) -> str:
    """The marks a number carries: its distance from the data and an unhealthy fit under it."""
    health = "[yellow]unhealthy fit[/]" if r.get("health") == "unhealthy" else "healthy fits"
    return f"{distance_text(r.get('extrapolation'))}; {health}"


def closed_form_text(out: dict[str, Any]) -> str:
    cf = out["closed_form"]
    if cf is None:
        return f"no closed form D*(N1): {out.get('closed_form_note') or 'too few sizes have a D*'}"
    lo, hi = cf["n1_range"]
    return f"closed form {cf['formula']} tokens, fitted over N1 {fmt(lo)}–{fmt(hi)} (the sizes trained)"


def dstar_table(out: dict[str, Any]) -> Table:
    table = Table("N1", "D* (tokens)", "80% interval", "95% interval", "all crossings", "who wins where",
                  "beyond the data; health", title="D*")
    for r in out["results"]:
        ivs = r["intervals"] or {}
        wins = "; ".join(f"{s['wins']} {fmt(s['from'])}–{fmt(s['to'])}" for s in r["segments"])
        table.add_row(fmt(r["n1"]), display.dstar(r), interval_text(ivs.get("80")), interval_text(ivs.get("95")),
                      ", ".join(fmt(x) for x in r["crossings"]) or "none", wins, flags_text(r))
    table.caption = closed_form_text(out)
    return table


def print_dstar(out: dict[str, Any]) -> None:
    """The D* table, then in yellow what each row's marks mean: an open interval, an extrapolation, the unhealthy
    fits it rests on."""
    console.print(dstar_table(out))
    for r in out["results"]:
        if (text := display.evidence(r)) is not None:
            console.print(f"D* at N1={fmt(r['n1'])}: {text}", highlight=False, soft_wrap=True)
        for note in row_notes(r):
            console.print(f"[yellow]D* at N1={fmt(r['n1'])}: {note}[/]", highlight=False, soft_wrap=True)


def row_notes(r: dict[str, Any], prefix: str = "") -> list[str]:
    """The warnings of one D* or verdict: its interval's open ends, its extrapolation, its unhealthy fits."""
    notes = [r[f"{prefix}interval_note"]] if r.get(f"{prefix}interval_note") else []
    ext = r.get(f"{prefix}extrapolation") or {}
    if ext.get("flagged"):
        notes.append(ext["note"])
    if not prefix and r.get("health") == "unhealthy":
        fits = dict.fromkeys(f"{p['fit']} ({p['kind']})" for p in r.get("health_problems", []))
        notes.append(f"rests on an unhealthy fit: {', '.join(fits)}; the analysis's problems say what to add")
    return notes


def decide_command(
    n1: Annotated[float, typer.Option("--n1", help="Dense model size (parameters).")],
    d1: Annotated[float, typer.Option("--d1", help="Tokens the dense model (with --expand: the parent MoE) was "
                                      "trained on (sunk cost).")],
    d2: Annotated[float, typer.Option("--d2", help="Tokens you would spend training the upcycled (expanded) MoE.")],
    moe: Annotated[Path | None, typer.Option("--moe", help="`upscale fit --json` of the from-scratch MoE (D, N); "
                                             "default: the newest analysis's.")] = None,
    upcycled: Annotated[Path | None, typer.Option("--upcycled", help="`upscale fit --json` of the upcycled law; "
                                                  "default: the newest analysis's.")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="Use this sweep's newest analysis.")] = None,
    group: GroupOpt = None,
    expand: Annotated[bool, typer.Option("--expand", help="Expert upcycling instead (GET /decisions/expand): grow "
                                         "an E-expert MoE trained D1 tokens to m·E experts, or train the m·E MoE "
                                         "from scratch; from the newest analysis's expansion studies.")] = False,
    study: Annotated[str | None, typer.Option("--study", help="With --expand: the expansion study as the analysis "
                                              "labels it (e.g. 'expand 4x1 -> 8x1 uniform'); default: the best "
                                              "one.")] = None,
    api: ApiOpt = None, token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    from upscale.fitting.dstar import decide

    if (expand and group) or (study and not expand):
        raise FitError("--group names an upcycling group, --study (with --expand) an expansion study: give the one "
                       "that matches the question")
    pair = _file_pair(moe, upcycled)
    if pair is not None:
        if expand:
            raise FitError("--expand answers from the analysis's expansion studies: leave out --moe and --upcycled")
        d = decide(*pair, n1, d1, d2).to_json()
    else:  # the service's answer, in-process or from --api: one code path
        with connect(api, token) as c:
            d = (c.decide_expand(n1, d1, d2, sweep_id=sweep, study=study) if expand
                 else c.decide(n1, d1, d2, sweep_id=sweep, group=group))
        a = d["analysis"]
        err_console.print(f"analysis {a['id']} of sweep {', '.join(a['sweep_ids']) or '(none: the synthetic demo)'}"
                          f" ({a['age_s']:.0f} s old), {'study' if expand else 'group'} {d['group']!r}, from "
                          f"{_where(api)}", soft_wrap=True, highlight=False)
    if as_json:
        print_json(d)
        return
    console.print(decision_text(d, expand))


# The help of `upscale decide` (an f-string cannot be a docstring).
decide_command.__doc__ = ("Upcycle or train from scratch: the catch-up budget, the verdict and its bootstrap "
                          f"probability. {StoredHelp} (GET /decisions/upcycle; with --expand, GET /decisions/expand)")


def decision_text(d: dict[str, Any], expand: bool = False) -> str:
    """A verdict as printed: the verdict and its bootstrap support, the catch-up budget ("never" when from scratch
    does not get there, "—" only when missing), and in yellow its extrapolation and unhealthy fits. ``expand``: an
    expansion study's verdict (its loss and probability in upcycling's fields are the expanded model's)."""
    if d.get("refused"):
        return f"[yellow]no verdict: {d['refused']}[/]"
    lead, runs, sunk = ("expanding", "expanded", "parent MoE") if expand else ("upcycling", "upcycled", "dense")
    prob = "" if d["probability_upcycle"] is None else (
        f" (bootstrap probability that {lead} wins: {d['probability_upcycle']:.0%}; a side needs "
        f"{d['decisive']:.0%})")
    catch = ("never reaches it" if d["catch_up_state"] == "never" else
             f"needs {fmt(d['catch_up_tokens'])} tokens to match it")
    ivs = d.get("catch_up_intervals") or {}
    if ivs:
        catch += f" (80% {interval_text(ivs.get('80'))}, 95% {interval_text(ivs.get('95'))})"
    lines = [f"verdict: [bold]{d['verdict']}[/]{prob}",
             f"{runs} loss after D2={fmt(d['d2'])} tokens: {d['loss_upcycled']:.4f}; from scratch {catch} (sunk "
             f"cost: the {sunk}'s D1={fmt(d['d1'])}; the paper counts {lead} efficient when the catch-up budget "
             f"exceeds D1)",
             f"beyond the trained ranges: {distance_text(d.get('extrapolation'))}"]
    if "dstar_state" in d:  # an answer of the service: D* at this N1 too
        star = {"dstar": d["dstar"], "dstar_state": d["dstar_state"], "search_range": d["dstar_search_range"]}
        ivs = d["dstar_intervals"] or {}
        name = "D*_expand" if expand else "D*"
        lines.append(f"{name} at N1={fmt(d['n1'])}: {display.dstar(star, lead)} tokens (80% "
                     f"{interval_text(ivs.get('80'))}, 95% {interval_text(ivs.get('95'))}); beyond the trained "
                     f"ranges: {distance_text(d['dstar_extrapolation'])}")
        lines += [f"[yellow]{name}: {note}[/]" for note in row_notes(d, "dstar_")]
    lines += [f"[yellow]{note}[/]" for note in row_notes(d)]
    return "\n".join(lines)


def optimal_command(
    upcycled: Annotated[Path, typer.Option("--upcycled", help="`upscale fit --json` of the `joint` law.")],
    d1: Annotated[float, typer.Option("--d1", help="Tokens the dense model was trained on.")],
    compute: Annotated[float, typer.Option("--compute", help="Upcycling budget C2 in FLOPs (6·N2·D2).")],
    as_json: JsonOpt = False,
) -> None:
    """Compute-optimal upcycling (Eq. 14): D2_opt and N1_opt for a FLOP budget, closed-form and numeric."""
    from upscale.fitting.optimal import closed_form, numeric
    from upscale.fitting.summary import load_fit

    if not (math.isfinite(d1) and d1 > 0):
        raise FitError(f"--d1 must be a positive token count, got {d1}")
    up = load_fit(upcycled)
    num = numeric(up, d1, compute)
    out: dict[str, Any] = {"d1": d1, "compute": compute,
                           "numeric": {"d2_opt": num.d2_tokens, "n1_opt": num.n1_params, "loss": num.loss}}
    try:
        cf = closed_form(up, d1, compute)
        out["closed_form"] = {"d2_opt": cf.d2_tokens, "n1_opt": cf.n1_params, "loss": cf.loss}
        out["relative_difference"] = abs(cf.d2_tokens - num.d2_tokens) / num.d2_tokens
    except FitError as e:
        out["closed_form"] = None
        out["closed_form_note"] = str(e)
    if as_json:
        print_json(out)
        return
    table = Table("", "D2_opt (tokens)", "N1_opt (params)", "loss", title=f"C2={compute:.3g} FLOPs, D1={d1:.3g}")
    for name in ("closed_form", "numeric"):
        if out.get(name):
            table.add_row(name.replace("_", "-"), fmt(out[name]["d2_opt"]), fmt(out[name]["n1_opt"]),
                          f"{out[name]['loss']:.4f}")
    console.print(table)
