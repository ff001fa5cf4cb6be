"""An analysis on its sweep's MLflow parent run: the record, its D* and verdict tables, its plots, a markdown summary
as the run's description and the headline numbers as metrics. The run tree itself (orchestrator/tracking.py) knows
nothing of analyses; this is where the control layer writes them."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.entities import RunTag

from upscale.fitting.groups import group_label, group_slug
from upscale.orchestrator.tracking import NOTE, RunTree, metrics_at
from upscale.sweeps import run_tags

if TYPE_CHECKING:
    import pandas as pd

ANALYSIS_COUNT = "analysis/number"  # the parent's analyses so far: the step of every analysis metric


def log_analysis(tree: RunTree, parent_run_id: str, record: dict, observations: pd.DataFrame,
                 plot_dir: Path | None) -> None:
    """One analysis of the sweep (fitting/analysis.py's `Analysis.to_json()`) on its parent run: the record as
    `analysis/analysis.json`, its D* and verdict tables as CSV, its observations, its plots (`plot_dir`'s PNG and
    PDF files, subfolders kept, under `analysis/plots/`), a markdown summary as the run's description, and the
    headline numbers as metrics at step n, the parent's n-th analysis (params are immutable; metrics keep every
    analysis's value)."""
    run = tree.client.get_run(parent_run_id)
    step = int(run.data.metrics.get(ANALYSIS_COUNT, 0)) + 1
    tree.client.log_dict(parent_run_id, record, "analysis/analysis.json")
    dstar, verdicts = _dstar_rows(record), _verdict_rows(record)
    with tempfile.TemporaryDirectory() as tmp:
        _csv(Path(tmp) / "dstar.csv", dstar)
        _csv(Path(tmp) / "verdicts.csv", verdicts)
        tree.client.log_artifacts(parent_run_id, tmp, "analysis")
    tree.log_observations(parent_run_id, observations, "analysis")
    if plot_dir is not None and Path(plot_dir).is_dir():
        tree.client.log_artifacts(parent_run_id, str(plot_dir), "analysis/plots")
    metrics = {ANALYSIS_COUNT: step, **_headline(record)}
    tree.client.log_batch(parent_run_id, metrics=metrics_at(metrics, step),
                          tags=[RunTag(NOTE, _summary_markdown(record, dstar, verdicts, step))])


def _label(up: dict[str, Any]) -> str:
    """An upcycled group of the record as its tables name it (fitting/groups.py's label; "all" when ungrouped)."""
    return group_label(up.get("group") or {}) or "all"


def _dstar_rows(record: dict) -> list[dict[str, Any]]:
    """One row per (upcycling group, N1): D*, its bootstrap interval, every crossing."""
    rows = []
    for up in record.get("upcycled") or []:
        for res in (up.get("dstar") or {}).get("results", []):
            ci = res.get("ci") or [None, None]
            rows.append({"group": _label(up), "n1": res.get("n1"), "dstar": res.get("dstar"), "ci_low": ci[0],
                         "ci_high": ci[1], "crossings": " ".join(f"{c:.4g}" for c in res.get("crossings") or [])})
    return rows


def _verdict_rows(record: dict) -> list[dict[str, Any]]:
    return [{"group": _label(up), **{k: v for k, v in d.items() if not isinstance(v, list | dict)}}
            for up in record.get("upcycled") or [] for d in up.get("decisions") or []]


def _headline(record: dict) -> dict[str, float]:
    """E, each fit's parameters, D* with its interval per group and N1, and P(upcycle) per verdict; a group is
    named in metrics as its plots' folder is (fitting/groups.py's slug)."""
    out: dict[str, float] = {}
    if record.get("E") is not None:
        out["analysis/E"] = record["E"]
    for k, v in ((record.get("scratch") or {}).get("params") or {}).items():
        out[f"fit/scratch/{k}"] = v
    for up in record.get("upcycled") or []:
        slug = group_slug(up.get("group") or {})
        for k, v in ((up.get("fit") or {}).get("params") or {}).items():
            out[f"fit/{slug}/{k}"] = v
        for res in (up.get("dstar") or {}).get("results", []):
            ci = res.get("ci") or [None, None]
            base = f"dstar/{slug}/N1_{run_tags.compact(res['n1'])}"
            out |= {base: res.get("dstar"), base + "/ci_low": ci[0], base + "/ci_high": ci[1]}
        for d in up.get("decisions") or []:
            at = "_".join(f"{k}_{run_tags.compact(d[k.lower()])}" for k in ("N1", "D1", "D2") if d.get(k.lower()))
            out[f"verdict/{slug}/{at}/p_upcycle"] = d.get("probability_upcycle")
    return {k: v for k, v in out.items() if isinstance(v, int | float)}


def _csv(path: Path, rows: list[dict[str, Any]]) -> None:
    import pandas as pd

    pd.DataFrame(rows).to_csv(path, index=False)


def _fmt(x: Any) -> str:
    return "–" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)


def _summary_markdown(record: dict, dstar: list[dict], verdicts: list[dict], step: int) -> str:
    """The analysis in a few lines for the run's overview: E, D* per group and N1, the verdicts, the problems."""
    lines = [f"**Analysis {step}** (artifacts: `analysis/`). Shared E = {_fmt(record.get('E'))}."]
    if dstar:
        lines += ["", "| group | N1 | D* | bootstrap interval |", "|---|---|---|---|"]
        lines += [f"| {r['group']} | {_fmt(r['n1'])} | {_fmt(r['dstar'])} | {_fmt(r['ci_low'])} – "
                  f"{_fmt(r['ci_high'])} |" for r in dstar]
    if verdicts:
        lines += ["", "| group | N1 | D1 | D2 | verdict | P(upcycle) |", "|---|---|---|---|---|---|"]
        lines += [f"| {v['group']} | {_fmt(v.get('n1'))} | {_fmt(v.get('d1'))} | {_fmt(v.get('d2'))} | "
                  f"{v.get('verdict', '–')} | {_fmt(v.get('probability_upcycle'))} |" for v in verdicts]
    for p in record.get("problems") or []:
        lines.append(f"\n- {p.get('fit', p.get('law'))}: {p.get('why')}" + (f" ({p['add']})" if p.get("add") else ""))
    return "\n".join(lines)
