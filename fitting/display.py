"""How a fit, an analysis and a verdict read as plain text and as HTML: the notebook's view (``repr`` and
``_repr_html_`` of `LawFit`, `Analysis` and `UpcycleDecision`), and the plain pieces the CLI colours.

An analysis prints a summary a researcher reads in ten seconds first (``summary_lines``): what the runs show at
matched budgets, D* per size with its 80% interval and how far it is projected beyond the budgets trained, how well
the laws predicted held-out runs, the one pair of runs to add, and the problems grouped by kind with a count; then a
short block per expansion study (``expansion_lines``: the same for D*_expand, or what the study lacks). The
detail (each fit, every D* with both intervals, the verdicts, every problem with what to add) follows only when asked
(``details``). The whole record (bootstrap samples included) stays on the object (``.report``, ``.to_json()``).
An open interval end reads "unbounded" and a missing value "—", never alike.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

MISSING = "—"


def number(x: float | None) -> str:
    """4 significant digits; a missing or non-finite value as "—"."""
    return MISSING if x is None or not math.isfinite(x) else f"{x:.4g}"


def interval(iv: dict[str, Any] | None) -> str:
    """An 80% or 95% interval ``{low, high, low_open, high_open}``: an open end reads "unbounded"."""
    if iv is None:
        return MISSING
    return (f"[{'unbounded' if iv['low_open'] else number(iv['low'])}, "
            f"{'unbounded' if iv['high_open'] else number(iv['high'])}]")


def dstar(r: dict[str, Any], leader: str = "upcycling") -> str:
    """D* from one result of `dstar_at`: the crossing, or where it lies when the searched range holds none
    (``leader``: what wins before D*, "expanding" for an expansion study)."""
    lo, hi = r.get("search_range") or (None, None)
    bracket = (r.get("answer") or {}).get("observed_bracket") or {}
    runs = (f"≥ {number(bracket.get('low'))} (the runs' bracket; the laws contradict the runs)"
            if bracket.get("low") is not None else "the runs' bracket (the laws contradict the runs)")
    return {"crossing": number(r["dstar"]), "above": f"> {number(hi)} ({leader} still wins there)",
            "below": f"< {number(lo)} (from scratch wins throughout)",
            "observed": runs}[r.get("dstar_state", "crossing")]  # records older than the state had a crossing


def distance(ext: dict[str, Any] | None) -> str:
    """How far an answer lies from the trained ranges ("inside", "N1 3x, tokens 12x"); "unknown" without them."""
    if not ext or ext.get("n1_factor") is None:
        return "unknown"
    parts = [f"{what} {number(f)}x" for what, f in (("N1", ext["n1_factor"]), ("tokens", ext["tokens_factor"]))
             if f is not None and f > 1]
    return ", ".join(parts) or "inside"


def flags(r: dict[str, Any]) -> str:
    """The marks an answer carries: its distance from the data ("extrapolated" past the factor), its health."""
    ext = r.get("extrapolation")
    where = distance(ext) + (" (extrapolated)" if ext and ext.get("flagged") else "")
    return f"{where}; {'unhealthy fit' if r.get('health') == 'unhealthy' else 'healthy fits'}"


def spans(ranges: dict[str, Sequence[float]]) -> str:
    """Trained ranges ``{column: [min, max]}`` as "N1 3e4–1.3e5, D 1e5–4.9e5"."""
    return ", ".join(f"{c} {number(lo)}–{number(hi)}" for c, (lo, hi) in ranges.items())


def evidence(r: dict[str, Any]) -> str | None:
    """What one D* rests on when predicted decays were fitted beside observed ones ("38% of its precision rests on
    12 predicted decays (held-out error 1.2%), 62% on 30 observed; observed decays alone: D* 2.9e+05"); None
    without predicted decays (no ``evidence``)."""
    ev = r.get("evidence")
    if not ev:
        return None
    n_pred, n_obs = sum(ev["predicted"].values()), sum(ev["observed"].values())
    error = "" if ev.get("held_out_sd") is None else f" (held-out error {ev['held_out_sd']:.1%})"
    share = ev.get("predicted_share")
    head = (f"{n_pred} predicted decays{error} and {n_obs} observed behind it (no crossing to weigh them at)"
            if share is None else
            f"{share:.0%} of its precision rests on {n_pred} predicted decays{error}, {1 - share:.0%} on {n_obs} "
            f"observed")
    return f"{head}; observed decays alone: D* {number(ev.get('observed_dstar'))}"


def curves_lines(curves: dict[str, Any]) -> list[str]:
    """The record's ``curves``: how many decays each table got from trunk curves, the noise that weighted them, and
    per family its held-out error and whose decay parameters it used, or why it gave none."""
    if not curves:
        return []
    points = ", ".join(f"{k} {v}" for k, v in (curves.get("points") or {}).items() if v)
    sigma = (curves.get("noise") or {}).get("point_sd")
    lines = [f"predicted decays from trunk curves: {points or 'none'}"
             + (f" (weighted against point noise {sigma:.2%})" if sigma is not None else "")]
    for name, f in (curves.get("families") or {}).items():
        if f.get("why"):
            lines.append(f"family {name}: no predictions: {f['why']}")
        elif f.get("sd") is not None:  # a record from before the pooling choice says nothing of it
            whose = {"pooled": ", decay parameters pooled over its trunks",
                     "own": ", decay parameters each trunk's own"}.get(f.get("pooling"), "")
            lines.append(f"family {name}: {f.get('n_predicted', 0)} predicted, held-out error {f['sd']:.2%} on "
                         f"{f.get('n_held_out', 0)} decays{whose}")
    return lines


def problem(p: dict[str, Any]) -> str:
    """One problem of a fit or an analysis: which fit, why, what to add."""
    where = f"{p['fit']} ({p['law']}): " if "fit" in p else ""
    return where + p["why"] + (f"; add {p['add']}" if p.get("add") else "")


def _param_rows(rep: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for k, v in rep["params"].items():
        if k in rep.get("fixed", {}):
            rows.append((k, number(v), "fixed"))
        else:
            lo, hi = rep.get("ci", {}).get(k, [None, None])
            rows.append((k, number(v), f"[{number(lo)}, {number(hi)}]" if k in rep.get("ci", {}) else MISSING))
    return rows


def _fit_head(rep: dict[str, Any]) -> str:
    trained = f", trained {spans(rep['trained'])}" if rep.get("trained") else ""
    return f"{rep['law']} fit on {rep['n_points']} points{trained}: LOO RMS {number(rep.get('loo_rms'))}"


def fit_lines(rep: dict[str, Any], indent: str = "") -> list[str]:
    """A fit report (`summary.report`) in a few lines: head, parameters with 95% intervals, problems."""
    width = max((len(k) for k in rep["params"]), default=0)
    lines = [indent + _fit_head(rep)]
    lines += [f"{indent}  {k:<{width}}  {v:>10}  {'(fixed)' if ci == 'fixed' else '95% ' + ci}"
              for k, v, ci in _param_rows(rep)]
    problems = rep.get("problems") or []
    lines += [f"{indent}  problem: {problem(p)}" for p in problems] or [f"{indent}  healthy: no problem found"]
    return lines


def _dstar_lines(star: dict[str, Any], indent: str) -> list[str]:
    lines = []
    for r in star.get("results", []):
        ivs = r.get("intervals") or {}
        lines.append(f"{indent}D* (tokens) at N1={number(r['n1'])}: {dstar(r)}; 80% {interval(ivs.get('80'))}, 95% "
                     f"{interval(ivs.get('95'))}; {flags(r)}")
        a = r.get("answer") or {}
        if a:
            pivs = r.get("parameter_intervals") or {}
            lines.append(f"{indent}  the paper's laws alone: D* {number(r.get('law_dstar'))}, 80% "
                         f"{interval(pivs.get('80'))} (parameter noise only)")
            weighted = [f for f in a.get("forms", []) if f["weight"] >= 0.01]
            lines.append(f"{indent}  forms: " + "; ".join(
                f"{f['scratch']} x {f['upcycled']} ({f['weight']:.0%}): {number(f['dstar'])}"
                + (f", stops at {number(f['stopped_at'])}" if f.get("stopped_at") else "") for f in weighted))
            if a.get("contradiction"):
                lines.append(f"{indent}  {a['contradiction']}")
        if r.get("interval_note"):
            lines.append(f"{indent}  {r['interval_note']}")
        if (text := evidence(r)) is not None:
            lines.append(f"{indent}  {text}")
    return lines


def decision_line(d: dict[str, Any]) -> str:
    """A verdict (`UpcycleDecision.to_json()` or one of an analysis's) in one line."""
    if d.get("refused"):
        return f"N1={number(d['n1'])}, D1={number(d['d1'])}, D2={number(d['d2'])}: no verdict: {d['refused']}"
    prob = "" if d.get("probability_upcycle") is None else f" ({d['probability_upcycle']:.0%} of resamples upcycle)"
    if d.get("law_verdict"):
        prob = f" (measured by the runs; the laws said {d['law_verdict']}{prob})"
    catch = ("from scratch never catches up" if d["catch_up_state"] == "never"
             else f"from scratch needs {number(d['catch_up_tokens'])} tokens to match")
    return (f"N1={number(d['n1'])}, D1={number(d['d1'])}, D2={number(d['d2'])}: {d['verdict']}{prob}; {catch}; "
            f"{flags(d)}")


def _analysis_head(record: dict[str, Any]) -> list[str]:
    """The title, the trained ranges and the shared E with its intervals."""
    points = ", ".join(f"{k} {v}" for k, v in record.get("points", {}).items())
    lines = [f"upscale analysis ({points} points; bootstrap {record['bootstrap']})"]
    lines += [f"trained ({table}): {spans(ranges)}" for table, ranges in (record.get("trained") or {}).items()]
    ivs = (record.get("E_bootstrap") or {}).get("intervals") or {}
    lines.append(f"shared E: {number(record['E'])}"
                 + (f" (80% {interval(ivs.get('80'))}, 95% {interval(ivs.get('95'))})" if ivs else ""))
    return lines + curves_lines(record.get("curves") or {})


def runs_line(observed: dict[str, Any], arm: str = "upcycling") -> str:
    """What the matched diagonal runs (upcycled at D1 = D2 = D against from scratch at D) show, per size, with the
    noise a lead must beat: one clause for all sizes when they agree. ``arm``: what the runs did ("expanding")."""
    brackets = observed.get("brackets") or []
    if not brackets:
        return f"the runs: no matched pair ({arm} at D1 = D2 = D and from scratch at D) to compare"
    noise = (observed.get("noise") or {}).get("gap_threshold")
    head = f"the runs (D1 = D2 = D, beyond noise past {noise:.1%}): " if noise is not None else "the runs: "

    def story(b: dict[str, Any]) -> str:
        if all(x == "upcycle" for x in b["leaders"]):
            text = f"{arm} ahead at every budget to {number(b['budgets'][-1])}"
        elif b["low"] is not None:
            text = f"{arm} ahead to {number(b['low'])}"
        else:
            text = f"{arm} never ahead beyond noise"
        return text + (f", from scratch ahead from {number(b['high'])}" if b["high"] is not None else "")

    stories = [story(b) for b in brackets]
    tops = ", ".join(f"{b['gaps'][-1]:+.1%}" for b in brackets)
    sizes = ", ".join(number(b["n1"]) for b in brackets)
    if len(set(stories)) == 1:
        return f"{head}{stories[0]} at N1 = {sizes} ({arm} ahead by {tops} at the top budget)"
    return head + "; ".join(f"N1={number(b['n1'])}: {t} ({b['gaps'][-1]:+.1%} at the top)"
                            for b, t in zip(brackets, stories, strict=True))


def settings_text(settings: dict[str, Any]) -> str:
    """An analysis's settings (what it was asked with: two answers for the same data differ only by these) in one
    line; records older than them say so."""
    if not settings:
        return "settings: not recorded (an analysis made before records kept them)"
    n1s = ", ".join(f"{n:.3g}" for n in settings.get("n1s") or []) or MISSING
    rows = settings.get("predicted_rows") or 0
    decays = (f"observed decays and {rows} decay end(s) predicted from trunk curves" if settings.get("curves")
              else "observed decays only")
    return (f"settings: {settings.get('source')}; {decays}; bootstrap {settings.get('bootstrap')}, seed "
            f"{settings.get('seed')}; D* at N1 {n1s}")


def _dstar_summary(r: dict[str, Any], name: str = "D*", leader: str = "upcycling") -> str:
    """One size's D* (``name``; ``leader`` what wins before it) in one line: the answer, its 80% interval, how far
    it is projected, the forms' spread."""
    a = r.get("answer") or {}
    ivs = r.get("intervals") or {}
    reach = (a.get("distance") or {}).get("note") or distance(r.get("extrapolation"))
    spread = a.get("spread")
    forms = f"; forms {number(spread[0])}–{number(spread[1])}" if spread and spread[0] != spread[1] else ""
    return f"{name} at N1={number(r['n1'])}: {dstar(r, leader)}; 80% {interval(ivs.get('80'))}; {reach}{forms}"


def problem_groups(problems: Sequence[dict[str, Any]]) -> list[str]:
    """The problems one line per (fit, kind) with a count and the first one's reason."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in problems:
        groups.setdefault((p.get("fit", ""), p.get("kind", "other")), []).append(p)
    return [f"{fit or 'analysis'}: {kind} x{len(ps)}: {ps[0]['why']}" for (fit, kind), ps in groups.items()]


def summary_lines(record: dict[str, Any]) -> list[str]:
    """The ten-second answer: per upcycling group, what the runs show, D* per size (80% interval, how far it is
    projected), the backtest, the pair of runs to add; then the problems, one line per kind and fit."""
    points = ", ".join(f"{k} {v}" for k, v in record.get("points", {}).items())
    lines = [f"upscale analysis ({points} runs; bootstrap {record.get('bootstrap', MISSING)})"]
    for up in record.get("upcycled", []):
        if up.get("label") and len(record.get("upcycled", [])) > 1:
            lines.append(f"upcycled {up['label']}:")
        lines += _answer_lines(up)
    if not record.get("upcycled"):
        lines.append("  no upcycled runs to compare")
    problems = record.get("problems") or []
    kinds: dict[str, int] = {}
    for p in problems:
        kinds[p.get("kind", "other")] = kinds.get(p.get("kind", "other"), 0) + 1
    lines.append(f"  problems: {len(problems)}" + (f" ({', '.join(f'{k} {n}' for k, n in kinds.items())}); the "
                                                    f"detail says which and what to add" if problems else ""))
    return lines + [line for e in record.get("expansions") or [] for line in expansion_lines(e)]


def _answer_lines(up: dict[str, Any], name: str = "D*", leader: str = "upcycling") -> list[str]:
    """One group's answer in the summary: what its runs show, its D* (``name``) per size, the backtest, the pair of
    runs to add next, and any verdict the runs contradict. ``leader``: what the group's runs did ("expanding")."""
    answer = up.get("answer") or {}
    results = (up.get("dstar") or {}).get("results", [])
    lines = ["  " + runs_line(answer["observed"], leader)] if answer.get("observed") else []
    lines += ["  " + _dstar_summary(r, name, leader) for r in results]
    backtest = answer.get("backtest") or {}
    if backtest.get("line") or backtest.get("note"):
        lines.append("  backtest: " + (backtest.get("line") or backtest["note"]))
    nexts = [n for n in ((r.get("answer") or {}).get("next") for r in results) if n]
    if nexts:
        best = max(nexts, key=lambda n: n["forms_sd"])
        lines.append(f"  next: {best['runs']} (~{best['flops']:.2g} FLOPs): where the law forms disagree most")
    return lines + ["  " + d["contradiction"] for d in up.get("decisions", []) if d.get("contradiction")]


def expansion_lines(study: dict[str, Any]) -> list[str]:
    """One expansion study of the record (``expansions``) in a short block: what its runs show, D*_expand per size
    (80% interval, how far projected), the backtest, the pair of runs to add, its problems; or what it lacks."""
    head = f"Expansion {study['label'].removeprefix('expand ')}"
    inner = study.get("analysis")
    if inner is None:
        return [f"{head}: not analysed: " + "; ".join(m["why"] + (f" (add {m['add']})" if m.get("add") else "")
                                                     for m in study.get("missing") or [])]
    up = (inner.get("upcycled") or [{}])[0]
    lines = [f"{head}:", *_answer_lines(up, "D*_expand", "expanding")]
    if not (up.get("dstar") or {}).get("results"):
        lines.append("  no D*_expand: " + ("; ".join(p["why"] for p in inner.get("problems") or []
                                                      if p.get("law") in ("chinchilla", "joint", "D*"))
                                            or "its laws were not fitted"))
    problems = inner.get("problems") or []
    lines.append(f"  problems: {len(problems)}")
    return lines


def analysis_lines(record: dict[str, Any], details: bool = True) -> list[str]:
    """An analysis record (`Analysis.to_json()`): the summary, then with ``details`` E, each fit, D* and verdicts
    per group, and the problems grouped by kind."""
    lines = summary_lines(record)
    if not details:
        return lines
    _, *rest = _analysis_head(record)
    lines += ["", "detail:", *(f"  {line}" for line in rest)]
    if record.get("scratch"):
        lines += ["  from scratch:", *fit_lines(record["scratch"], "    ")]
    for up in record.get("upcycled", []):
        lines.append(f"  upcycled{' ' + up['label'] if up.get('label') else ''}:")
        if up.get("fit"):
            lines += fit_lines(up["fit"], "    ")
        if up.get("dstar"):
            lines += _dstar_lines(up["dstar"], "    ")
        lines += [f"    {decision_line(d)}" for d in up.get("decisions", [])]
    problems = record.get("problems") or []
    lines.append(f"  {len(problems)} problem(s)" + (":" if problems else ": every fit is healthy"))
    lines += [f"    - {problem(p)}" for p in problems]
    return lines


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _problems_html(problems: Sequence[dict[str, Any]]) -> str:
    if not problems:
        return "<p>healthy: no problem found</p>"
    items = "".join(f"<li>{html.escape(problem(p))}</li>" for p in problems)
    return f"<p style='color:#a15c00'>{len(problems)} problem(s):</p><ul>{items}</ul>"


def fit_html(rep: dict[str, Any]) -> str:
    return (f"<div><b>{html.escape(_fit_head(rep))}</b>"
            + _table(("parameter", "value", "95% interval"), _param_rows(rep)) + _problems_html(rep.get("problems"))
            + "</div>")


def analysis_html(record: dict[str, Any]) -> str:
    """The same page as `analysis_lines`, as tables: fits, D* and verdicts per group, problems."""
    title, *rest = _analysis_head(record)
    parts = [f"<div><b>{html.escape(title)}</b>", *(f"<p>{html.escape(line)}</p>" for line in rest)]
    if record.get("scratch"):
        parts.append("<h4>from scratch</h4>" + fit_html(record["scratch"]))
    for up in record.get("upcycled", []):
        parts.append(f"<h4>upcycled {html.escape(up.get('label') or '')}</h4>")
        if up.get("fit"):
            parts.append(fit_html(up["fit"]))
        rows = [(number(r["n1"]), dstar(r), interval((r.get("intervals") or {}).get("80")),
                 interval((r.get("intervals") or {}).get("95")), flags(r))
                for r in (up.get("dstar") or {}).get("results", [])]
        if rows:
            parts.append(_table(("N1", "D* (tokens)", "80% interval", "95% interval", "distance; health"), rows))
        parts += [f"<p>D* at N1={number(r['n1'])}: {html.escape(text)}</p>"
                  for r in (up.get("dstar") or {}).get("results", []) if (text := evidence(r)) is not None]
        parts += [f"<p>{html.escape(decision_line(d))}</p>" for d in up.get("decisions", [])]
    parts.append(_problems_html(record.get("problems")))
    for study in record.get("expansions") or []:
        head, *rest = expansion_lines(study)
        parts.append(f"<h4>{html.escape(head)}</h4>" + "".join(f"<p>{html.escape(line)}</p>" for line in rest))
    return "".join(parts) + "</div>"
