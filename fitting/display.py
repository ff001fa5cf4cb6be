"""How a fit, an analysis and a verdict read as plain text and as HTML: the notebook's view (``repr`` and
``_repr_html_`` of `LawFit`, `Analysis` and `UpcycleDecision`), and the plain pieces the CLI colours.

A summary is short on purpose: the parameters with their 95% intervals, D* per size with its 80% and 95% intervals
and its distance from the data, the verdict with its support, and every problem with what to add. The whole record
(bootstrap samples included) stays on the object (``.report``, ``.to_json()``); printing it would bury the answer.
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


def dstar(r: dict[str, Any]) -> str:
    """D* from one result of `dstar_at`: the crossing, or where it lies when the searched range holds none."""
    lo, hi = r["search_range"]
    return {"crossing": number(r["dstar"]), "above": f"> {number(hi)} (upcycling still wins there)",
            "below": f"< {number(lo)} (from scratch wins throughout)"}[r["dstar_state"]]


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
        if (text := evidence(r)) is not None:
            lines.append(f"{indent}  {text}")
    return lines


def decision_line(d: dict[str, Any]) -> str:
    """A verdict (`UpcycleDecision.to_json()` or one of an analysis's) in one line."""
    if d.get("refused"):
        return f"N1={number(d['n1'])}, D1={number(d['d1'])}, D2={number(d['d2'])}: no verdict: {d['refused']}"
    prob = "" if d.get("probability_upcycle") is None else f" ({d['probability_upcycle']:.0%} of resamples upcycle)"
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


def analysis_lines(record: dict[str, Any]) -> list[str]:
    """An analysis record (`Analysis.to_json()`) in a page: E, each fit, D* and verdicts per group, problems."""
    title, *rest = _analysis_head(record)
    lines = [title, *(f"  {line}" for line in rest)]
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
    return "".join(parts) + "</div>"
