"""Analyses in MLflow: each keeps its own artifacts, and a sweep's run shows the newest analysis of that sweep.

Where an analysis lands depends on whose it is:

* **The sweep's own** (its sweep set is exactly that sweep, and no refit schedule made it: the analysis loop, a
  request, `upscale analyze`): on the sweep's parent run, its files under `analyses/<analysis id>/`. Only when it
  is newer (created later) than the analysis the run shows does it become the run's description (tag NOTE of
  orchestrator/tracking.py), its `upscale.analysis.latest` pointer, its health tags, its numbers and its curves; so a
  late-finishing older analysis keeps its files but never replaces a newer one.
* **Any other** (several sweeps, or a refit): a run of its own, nested under the first of its sweeps' runs, with the
  same files under `analyses/<analysis id>/`, its summary as description, its numbers and curves; every other
  sweep of it gets a small child run linking there. A refit of several sweeps by another owner therefore never
  touches the description or files of a sweep's run.

The summary lists, beside each D* and verdict, its health and whether it is extrapolated, and the analysis's
problems; tags `analysis.health` (ok | unhealthy) and `analysis.problems` (a count) let the runs table filter on
them. The run tree itself (orchestrator/tracking.py) knows nothing of analyses; this is where the control layer
writes them. Records written before fit health and D* states read as "–" where a key is absent.

What MLflow charts is what varies along an axis: D* and its interval ends per upcycled group as one curve over N1,
P(upcycle) per N1 and D1 as one curve over D2 (`curves`). A single number per analysis (E, a fit's parameters) would
chart as one point, so it is a tag (`headline`), a column the runs table can show. A later analysis shown on the same
run logs its points again at the same N1 and D2, later in time. With decays predicted from trunk curves, each D*'s
share of its precision on them and the D* of the observed decays alone are curves too
(`dstar/<group>/predicted_share`, `dstar/<group>/observed_only`), and per group the largest share and the decays
behind its laws are tags (`analysis.evidence.<group>.*`), as are each curve family's held-out error and whose decay
parameters it used (`analysis.curves.<family>.*`). Tags go in batches of MLflow's limit per call.

Each analysed expansion study (expert upcycling, the record's ``expansions``) is one more group, named by its study
(``expand 4x1 -> 8x1 uniform``): its D*_expand and verdicts in the tables, curves and tags as every D*; its problems,
and an arm a study lacks, count in `analysis.problems` and the health.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.entities import Metric, RunTag

from upscale.fitting import display
from upscale.fitting.groups import as_slug, group_label, group_slug
from upscale.orchestrator.tracking import NOTE, RunTree, run_link
from upscale.sweeps import run_tags

ANALYSIS_COUNT = run_tags.PREFIX + "analysis.count"  # on a sweep's run: how many analyses it has shown
ANALYSIS_ID = run_tags.PREFIX + "analysis_id"  # on an analysis's own run and its link children
LATEST = run_tags.PREFIX + "analysis.latest"  # on a sweep's run: the id of the analysis its description shows
LATEST_CREATED = run_tags.PREFIX + "analysis.latest_created_at"  # ... and when that analysis was created (UTC ISO)
HEALTH = "analysis.health"  # ok | unhealthy, for `tags."analysis.health" = 'unhealthy'` in the runs table
PROBLEMS = "analysis.problems"  # how many problems the analysis reports
EXTRAPOLATED = "analysis.extrapolated"  # how many D*s and verdicts are flagged as extrapolated
UNBOUNDED = "unbounded"  # an interval's open end; a missing value is "–", never the same spelling
MAX_TAGS_PER_BATCH = 100  # MLflow refuses a log_batch with more tags than this
MAX_NOTE = 7800  # MLflow keeps a tag's first 8000 characters: the description is fitted under that


@dataclass(frozen=True)
class AnalysisMeta:
    """Which analysis a record is (control/analyses.py's row): its id, sweeps, trigger, owner and creation time."""

    id: str
    sweep_ids: Sequence[str]
    trigger: str
    owner: str
    created_at: datetime

    @property
    def stamp(self) -> str:
        """created_at as a fixed-width UTC ISO string, so that string order is time order."""
        return self.created_at.isoformat(timespec="microseconds")

    @property
    def folder(self) -> str:
        return f"analyses/{self.id}"


def owns(meta: AnalysisMeta, sweep_id: str) -> bool:
    """Whether the analysis is the sweep's own: of exactly that sweep, and not made by a refit schedule."""
    return list(meta.sweep_ids) == [sweep_id] and meta.trigger != "refit"


def log_analysis(tree: RunTree, sweep_runs: Sequence[tuple[str, str]], meta: AnalysisMeta, record: dict,
                 observations: pd.DataFrame, plot_dir: Path | None) -> str:
    """Log one analysis (fitting/analysis.py's `Analysis.to_json()`; ``sweep_runs``: (sweep id, its parent run id) of
    the sweeps that have a run) where it belongs (module docstring); returns the run its files went to."""
    if len(sweep_runs) == 1 and owns(meta, sweep_runs[0][0]):
        run_id = sweep_runs[0][1]
        _log_files(tree, run_id, meta, record, observations, plot_dir)
        show_on_sweep_run(tree, run_id, meta, record)
        return run_id
    return _log_own_run(tree, sweep_runs, meta, record, observations, plot_dir)


def show_on_sweep_run(tree: RunTree, run_id: str, meta: AnalysisMeta, record: dict) -> bool:
    """Make the analysis the one the sweep's run shows (description, pointer, health tags, headline metrics at the
    next step) unless the run already shows one created later or this same one; True when it did."""
    run = tree.client.get_run(run_id)
    shown = run.data.tags.get(LATEST_CREATED)
    if shown is not None and shown >= meta.stamp:
        return False
    number = int(run.data.tags.get(ANALYSIS_COUNT, 0)) + 1
    tags = {NOTE: summary_markdown(record, meta, f"Analysis {number} of this sweep"), LATEST: meta.id,
            LATEST_CREATED: meta.stamp, ANALYSIS_COUNT: str(number), **health_tags(record), **headline(record)}
    log_in_batches(tree, run_id, curves(record), tags)
    return True


def log_in_batches(tree: RunTree, run_id: str, metrics: list[Metric], tags: dict[str, str]) -> None:
    """``metrics`` and ``tags`` in as many log_batch calls as MLflow's limit of MAX_TAGS_PER_BATCH tags per call
    takes (an analysis of many groups, with curves, has more tags than that)."""
    items = [RunTag(k, v) for k, v in tags.items()]
    tree.client.log_batch(run_id, metrics=metrics, tags=items[:MAX_TAGS_PER_BATCH])
    for i in range(MAX_TAGS_PER_BATCH, len(items), MAX_TAGS_PER_BATCH):
        tree.client.log_batch(run_id, tags=items[i:i + MAX_TAGS_PER_BATCH])


def _log_own_run(tree: RunTree, sweep_runs: Sequence[tuple[str, str]], meta: AnalysisMeta, record: dict,
                 observations: pd.DataFrame, plot_dir: Path | None) -> str:
    """The analysis's own run under the first sweep's run, and a child linking it under each other sweep's run."""
    what = f"{meta.trigger} analysis {meta.id}"
    of = f"{len(meta.sweep_ids)} sweeps" if len(meta.sweep_ids) > 1 else "1 sweep"
    note = summary_markdown(record, meta, f"{meta.trigger.capitalize()} of {of} ({', '.join(meta.sweep_ids)})")
    tags = {run_tags.ROLE: "analysis", ANALYSIS_ID: meta.id, run_tags.SWEEP_ID: ",".join(meta.sweep_ids),
            NOTE: note, **health_tags(record), **headline(record)}
    (first_sweep, first_run), others = sweep_runs[0], sweep_runs[1:]
    run = tree.client.create_run(tree.experiment_id, run_name=what,
                                 tags={"mlflow.parentRunId": first_run, **tags})
    run_id = run.info.run_id
    _log_files(tree, run_id, meta, record, observations, plot_dir)
    tree.client.log_batch(run_id, metrics=curves(record))
    tree.client.set_terminated(run_id, "FINISHED")
    link = run_link(tree.experiment_id, run_id)
    for _, parent in others:
        linked = {**tags, run_tags.ROLE: "analysis-link",
                  NOTE: f"Logged under sweep {first_sweep}'s run, in run [{what}]({link}) (its files are there).\n\n"
                        + note}
        child = tree.client.create_run(tree.experiment_id, run_name=f"{what} (shared)",
                                       tags={"mlflow.parentRunId": parent, **linked})
        tree.client.set_terminated(child.info.run_id, "FINISHED")
    return run_id


def _log_files(tree: RunTree, run_id: str, meta: AnalysisMeta, record: dict, observations: pd.DataFrame,
               plot_dir: Path | None) -> None:
    """`analyses/<id>/`: the record as analysis.json, its D* and verdict tables as CSV, its observations, its plots
    (``plot_dir``'s files, subfolders kept, under plots/). Nothing outside the analysis's own folder is written."""
    tree.client.log_dict(run_id, record, f"{meta.folder}/analysis.json")
    with tempfile.TemporaryDirectory() as tmp:
        _csv(Path(tmp) / "dstar.csv", dstar_rows(record))
        _csv(Path(tmp) / "verdicts.csv", verdict_rows(record))
        tree.client.log_artifacts(run_id, tmp, meta.folder)
    tree.log_observations(run_id, observations, meta.folder)
    if plot_dir is not None and Path(plot_dir).is_dir():
        tree.client.log_artifacts(run_id, str(plot_dir), f"{meta.folder}/plots")


def _label(up: dict[str, Any]) -> str:
    """An upcycled group of the record as its tables name it (fitting/groups.py's label; "all" when ungrouped)."""
    return group_label(up.get("group") or {}) or "all"


def groups(record: dict) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, slug, entry) of each upcycled group of the record, then of each analysed expansion study's expanded
    group (named by the study): D*_expand is tabled, charted and tagged as every D* is."""
    out = [(_label(up), group_slug(up.get("group") or {}), up) for up in record.get("upcycled") or []]
    return out + [(e["label"], as_slug(e["label"]), up) for e in record.get("expansions") or []
                  for up in (e.get("analysis") or {}).get("upcycled") or []]


def all_problems(record: dict) -> list[dict[str, Any]]:
    """The record's problems and each expansion study's (its fits', and an arm it lacks), named by the study."""
    out = list(record.get("problems") or [])
    for e in record.get("expansions") or []:
        inner = e.get("analysis") or {}
        out += [{**p, "fit": f"{e['label']}: {p.get('fit', p.get('law'))}"} for p in inner.get("problems") or []]
        out += [{"law": "expansion", "fit": f"{e['label']}: {m['arm']}", "why": m["why"], "add": m.get("add", ""),
                 "kind": "missing"} for m in e.get("missing") or []]
    return out


def _interval(res: dict[str, Any], level: str) -> tuple[Any, Any]:
    """(low, high) of the result's ``level`` interval, an open end as UNBOUNDED and a missing one as None; old
    records (no ``intervals``) give their bootstrap ``ci`` as every level."""
    intervals = res.get("intervals")
    if intervals is None:
        ci = res.get("ci") or [None, None]
        return ci[0], ci[1]
    one = intervals.get(level) or {}
    return tuple(UNBOUNDED if one.get(f"{end}_open") and one.get(end) is None else one.get(end)
                 for end in ("low", "high"))


def _extrapolated(d: dict[str, Any]) -> bool:
    return bool((d.get("extrapolation") or {}).get("flagged"))


def dstar_rows(record: dict) -> list[dict[str, Any]]:
    """One row per (upcycling group or expansion study, N1): D*, its state, intervals, health, extrapolation, every
    crossing."""
    rows = []
    for label, _, up in groups(record):
        for res in (up.get("dstar") or {}).get("results", []):
            lo80, hi80 = _interval(res, "80")
            lo95, hi95 = _interval(res, "95")
            ex = res.get("extrapolation") or {}
            rows.append({"group": label, "n1": res.get("n1"), "dstar": res.get("dstar"),
                         "dstar_state": res.get("dstar_state"), "low_80": lo80, "high_80": hi80, "low_95": lo95,
                         "high_95": hi95, "health": res.get("health"),
                         "health_problems": "; ".join(_problem_names(res)), "extrapolated": ex.get("flagged"),
                         "n1_factor": ex.get("n1_factor"), "tokens_factor": ex.get("tokens_factor"),
                         "crossings": " ".join(f"{c:.4g}" for c in res.get("crossings") or [])})
    return rows


def verdict_rows(record: dict) -> list[dict[str, Any]]:
    return [{"group": label, **{k: v for k, v in d.items() if not isinstance(v, list | dict)},
             "health_problems": "; ".join(_problem_names(d)),
             "extrapolated": (d.get("extrapolation") or {}).get("flagged")}
            for label, _, up in groups(record) for d in up.get("decisions") or []]


def _problem_names(d: dict[str, Any]) -> list[str]:
    return [f"{p.get('fit', p.get('law'))}: {p.get('kind')}" for p in d.get("health_problems") or []]


def headline(record: dict) -> dict[str, str]:
    """The analysis's single numbers as tags (a chart of one point per analysis says nothing): `analysis.E` and
    each fit's parameters, `analysis.fit.<group>.<name>` (a group named as its plots' folder, fitting/groups.py's
    slug), in 4 significant digits, None left out; and per group the backtest's sentence
    (`analysis.backtest.<group>`). An expansion study is a group named by its study (``expand_4x1_8x1_uniform``)."""
    out: dict[str, Any] = {"analysis.E": record.get("E")}
    for k, v in ((record.get("scratch") or {}).get("params") or {}).items():
        out[f"analysis.fit.scratch.{k}"] = v
    for _, slug, up in groups(record):
        for k, v in ((up.get("fit") or {}).get("params") or {}).items():
            out[f"analysis.fit.{slug}.{k}"] = v
        out |= _evidence(slug, up)
    numbers = {k: f"{v:.4g}" if isinstance(v, float) else str(v) for k, v in out.items() if _number(v)}
    backtests = {f"analysis.backtest.{slug}": line for _, slug, up in groups(record)
                 if (line := ((up.get("answer") or {}).get("backtest") or {}).get("line"))}
    return numbers | backtests | _curve_families(record)


def _curve_families(record: dict) -> dict[str, str]:
    """With curves: per family that predicted decays, their held-out error and whose decay parameters they use
    (`analysis.curves.<family>.held_out_sd`, `.decay_parameters`: "own" or "pooled"; the record says why a family
    predicted none)."""
    out = {}
    for name, f in ((record.get("curves") or {}).get("families") or {}).items():
        if f.get("why"):
            continue
        base = f"analysis.curves.{as_slug(name) or 'all'}"
        if _number(f.get("sd")):
            out[f"{base}.held_out_sd"] = f"{f['sd']:.4g}"
        if f.get("pooling"):
            out[f"{base}.decay_parameters"] = str(f["pooling"])
    return out


def _evidence(slug: str, up: dict[str, Any]) -> dict[str, Any]:
    """With predicted decays (curves): the group's largest share of a D*'s precision on them
    (`analysis.evidence.<group>.predicted_share`) and the predicted and observed decays behind its two laws."""
    found = [r["evidence"] for r in (up.get("dstar") or {}).get("results", []) if r.get("evidence")]
    if not found:
        return {}
    shares = [e["predicted_share"] for e in found if e.get("predicted_share") is not None]
    out = {f"analysis.evidence.{slug}.predicted": sum(found[0]["predicted"].values()),
           f"analysis.evidence.{slug}.observed": sum(found[0]["observed"].values())}
    return out | ({f"analysis.evidence.{slug}.predicted_share": float(max(shares))} if shares else {})


def curves(record: dict) -> list[Metric]:
    """The analysis's numbers that vary along an axis, as curves: per upcycled group, D* and its interval ends over
    N1 (`dstar/<group>`, `dstar/<group>/low_80`, ...: step = N1; only a D* that is a crossing, only bounded ends),
    and P(upcycle) over D2 per N1 and D1 (`verdict/<group>/p_upcycle_N1_<n1>_D1_<d1>`: step = D2)."""
    points: list[tuple[str, float, int]] = []
    for _, slug, up in groups(record):
        for res in (up.get("dstar") or {}).get("results", []):
            if res.get("dstar_state", "crossing") != "crossing" or res.get("n1") is None:
                continue
            base, ci = f"dstar/{slug}", res.get("ci") or [None, None]
            values = {base: res.get("dstar"), base + "/ci_low": ci[0], base + "/ci_high": ci[1]}
            ev = res.get("evidence") or {}
            values |= {base + "/predicted_share": ev.get("predicted_share"),
                       base + "/observed_only": ev.get("observed_dstar")} if ev else {}
            for level in ("80", "95") if res.get("intervals") else ():
                lo, hi = _interval(res, level)
                values |= {f"{base}/low_{level}": lo, f"{base}/high_{level}": hi}
            points += [(k, v, int(res["n1"])) for k, v in values.items()]
        for d in up.get("decisions") or []:
            if d.get("d2") is None:
                continue
            at = "_".join(f"{k}_{run_tags.compact(d[k.lower()])}" for k in ("N1", "D1") if d.get(k.lower()))
            points.append((f"verdict/{slug}/p_upcycle_{at}", d.get("probability_upcycle"), int(d["d2"])))
    now = int(time.time() * 1000)
    return [Metric(k, float(v), now, step) for k, v, step in sorted(points, key=lambda p: (p[0], p[2]))
            if _number(v)]


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def health_tags(record: dict) -> dict[str, str]:
    """`analysis.health`: unhealthy when the analysis reports a problem or any D* or verdict rests on an unhealthy
    fit; `analysis.problems`: how many problems; `analysis.extrapolated`: how many D*s and verdicts are flagged (absent
    when the record does not say)."""
    marked = [d for _, _, up in groups(record)
              for d in [*(up.get("dstar") or {}).get("results", []), *(up.get("decisions") or [])]]
    problems = len(all_problems(record))
    unhealthy = problems > 0 or any(d.get("health") == "unhealthy" for d in marked)
    out = {HEALTH: "unhealthy" if unhealthy else "ok", PROBLEMS: str(problems)}
    if any("extrapolation" in d for d in marked):  # records older than the extrapolation check cannot say
        out[EXTRAPOLATED] = str(sum(_extrapolated(d) for d in marked))
    return out


def _csv(path: Path, rows: list[dict[str, Any]]) -> None:
    pd.DataFrame(rows).to_csv(path, index=False)


def _fmt(x: Any) -> str:
    """A number in 3 significant digits; None (missing) as "–"; UNBOUNDED as it is."""
    if x is None:
        return "–"
    if isinstance(x, float | int) and not isinstance(x, bool):
        return f"{x:.3g}"
    return str(x)


def _dstar_cell(res: dict[str, Any]) -> str:
    state = res.get("dstar_state")
    if state == "above":
        return "beyond the searched range (upcycling still wins at its top)"
    if state == "below":
        return "none: from scratch wins over the whole searched range"
    if state == "observed":
        return "bounded by the runs alone (the laws contradict them)"
    return _fmt(res.get("dstar"))


def _interval_cell(res: dict[str, Any]) -> str:
    if res.get("intervals") is None and res.get("ci") is None:
        return "–"
    if res.get("intervals") is None:
        lo, hi = _interval(res, "95")
        return f"{_fmt(lo)} – {_fmt(hi)}"
    return " · ".join(f"{level}%: {_fmt(lo)} – {_fmt(hi)}"
                      for level in ("80", "95") for lo, hi in [_interval(res, level)]
                      if (res["intervals"] or {}).get(level) is not None) or "–"


def _health_cell(d: dict[str, Any]) -> str:
    health = d.get("health")
    if health is None:
        return "–"
    if health != "unhealthy":
        return str(health)
    kinds = sorted({p.get("kind") for p in d.get("health_problems") or [] if p.get("kind")})
    return "⚠ unhealthy" + (f" ({', '.join(kinds)})" if kinds else "")


def _extrapolation_cell(d: dict[str, Any]) -> str:
    ex = d.get("extrapolation")
    if ex is None:
        return "–"
    if not ex.get("flagged"):
        return "no"
    factors = [f"{what} ×{ex[key]:.3g}" for key, what in (("n1_factor", "N1"), ("tokens_factor", "tokens"))
               if isinstance(ex.get(key), int | float) and ex[key] > 1]
    return "⚠ extrapolated" + (f" {', '.join(factors)}" if factors else "")


def _trained_line(record: dict) -> str | None:
    """The ranges trained on, per kind, that extrapolation is measured from."""
    trained = record.get("trained") or {}
    names = {"upcycled": "upcycled", "scratch": "from scratch", "dense": "dense"}
    parts = []
    for kind, ranges in trained.items():
        spans = [f"{axis} {_fmt(lo)}–{_fmt(hi)}" for axis, span in (ranges or {}).items()
                 if isinstance(span, list | tuple) and len(span) == 2 for lo, hi in [span]]
        if spans:
            parts.append(f"{names.get(kind, kind)} {', '.join(spans)}")
    return f"Trained on: {'; '.join(parts)}." if parts else None


def summary_markdown(record: dict, meta: AnalysisMeta, title: str) -> str:
    """The analysis in a few lines for a run's overview: what it is and its health, E, the trained ranges, D* per
    group and N1 and the verdicts (each with its health and extrapolation), the notes and the problems."""
    tags = health_tags(record)
    health = "ok" if tags[HEALTH] == "ok" else f"⚠ unhealthy, {tags[PROBLEMS]} problem(s)"
    lines = [f"**{title}**: analysis `{meta.id}` ({meta.trigger} by {meta.owner}, created "
             f"{meta.created_at:%Y-%m-%d %H:%M:%S} UTC; files in `{meta.folder}/`). Health: {health}.", "",
             "```", display.settings_text(record.get("settings") or {}), *display.summary_lines(record), "```", "",
             f"Shared E = {_fmt(record.get('E'))}."]
    if trained := _trained_line(record):
        lines.append(trained)
    notes = []
    results = [(label, res) for label, _, up in groups(record) for res in (up.get("dstar") or {}).get("results", [])]
    if results:
        lines += ["", "| group | N1 | D* | interval | health | extrapolation |", "|---|---|---|---|---|---|"]
        for group, res in results:
            lines.append(f"| {group} | {_fmt(res.get('n1'))} | {_dstar_cell(res)} | {_interval_cell(res)} | "
                         f"{_health_cell(res)} | {_extrapolation_cell(res)} |")
            at = f"{group}, N1 {_fmt(res.get('n1'))}"
            notes += [f"{at}: {text}" for text in (res.get("interval_note"),
                                                    (res.get("extrapolation") or {}).get("note"),
                                                    (res.get("answer") or {}).get("contradiction")) if text]
    verdicts = [(label, d) for label, _, up in groups(record) for d in up.get("decisions") or []]
    if verdicts:
        lines += ["", "| group | N1 | D1 | D2 | verdict | P(upcycle) | health | extrapolation |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {group} | {_fmt(v.get('n1'))} | {_fmt(v.get('d1'))} | {_fmt(v.get('d2'))} | "
                  f"{v.get('verdict') or '–'} | {_fmt(v.get('probability_upcycle'))} | {_health_cell(v)} | "
                  f"{_extrapolation_cell(v)} |" for group, v in verdicts]
    if notes:
        lines += ["", "Notes:", *[f"- {n}" for n in notes]]
    lines += ["", f"Intervals: an open end is \"{UNBOUNDED}\", a missing value \"–\"."]
    problems = all_problems(record)
    if problems:
        lines += ["", f"Problems ({len(problems)}):"]
        lines += [f"- {p.get('fit', p.get('law'))}" + (f" [{p['kind']}]" if p.get("kind") else "") +
                  f": {p.get('why')}" + (f" (add: {p['add']})" if p.get("add") else "") for p in problems]
    return _fitted("\n".join(lines), f"`{meta.folder}/analysis.json`")


def _fitted(text: str, where: str) -> str:
    """``text`` cut at a line to fit MAX_NOTE, saying how much was left out and where the whole is."""
    if len(text) <= MAX_NOTE:
        return text
    kept: list[str] = []
    size = 0
    lines = text.split("\n")
    for line in lines:
        if size + len(line) + 1 > MAX_NOTE - 200:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join([*kept, "", f"… {len(lines) - len(kept)} more line(s): the whole record is {where}."])
