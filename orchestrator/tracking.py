"""The MLflow run tree, MLflow as upscale's dashboard: one parent run per sweep, one child run per segment.

* The experiment `upscale` is created with its artifact location (`Settings.mlflow_artifact_root`: under
  UPSCALE_HOME by default, the server's when tracking goes to a server; never the working directory) and MLflow 3's
  experiment-kind tag for the model-training view.
* A sweep's parent run is named after the sweep and holds its spec (`sweep.json`, and flattened as params), the
  observations (`observations.csv` and an MLflow dataset input), and at each analysis `log_analysis`'s record,
  tables, plots and headline numbers.
* A segment's child run is named after its kind and grid axes, with its configuration as params and only its ids
  and state as tags (sweeps/run_tags.py, which the worker uses for a segment trained alone). The orchestrator
  creates it and hands its id to the worker (`SegmentRuntime.mlflow_run_id`), which logs the curves (step = tokens
  seen); when it ends the orchestrator logs the result once, as `summary/*` at the segment's last token count, so
  no curve gets a point back at step 0.
* A segment shared by several sweeps is trained once, under the sweep that trained it; every other sweep's parent
  gets a "(reused)" child with the same params, the trained run's summary metrics and a link to it, so each
  sweep's tree is complete.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from upscale.fitting.groups import group_label, group_slug
from upscale.sweeps import run_tags
from upscale.sweeps.segments import SegmentSpec
from upscale.workers.tracking import EXPERIMENT, client_for, ensure_experiment

if TYPE_CHECKING:
    import pandas as pd

    from upscale.orchestrator.settings import Settings

SUMMARY = "summary/"  # a segment's result, logged once: its own names, so the curves stay curves
ANALYSIS_COUNT = "analysis/number"  # the parent's analyses so far: the step of every analysis metric
NOTE = "mlflow.note.content"  # MLflow's run description (markdown), shown on the run's overview


@dataclass(frozen=True)
class SegmentRun:
    """A segment done in the store, as a sweep's tree shows it: its key, spec (LR resolved), axes in this sweep
    and the run that trained it."""

    key: str
    spec: SegmentSpec
    axes: dict[str, Any]
    run_id: str


class RunTree:
    """Creates, fills and closes the sweep and segment runs in one MLflow experiment."""

    def __init__(self, tracking_uri: str, artifact_root: str | None = None, experiment: str = EXPERIMENT) -> None:
        self.tracking_uri = tracking_uri
        self.client = client_for(tracking_uri)
        self.experiment_id = ensure_experiment(self.client, artifact_root, experiment)

    @classmethod
    def for_settings(cls, settings: Settings) -> RunTree:
        return cls(settings.mlflow_tracking_uri, settings.mlflow_artifact_root or None)

    def start_sweep(self, sweep_id: str, name: str, spec: dict[str, Any]) -> str:
        run = self.client.create_run(self.experiment_id, run_name=run_tags.sweep_run_name(name, sweep_id),
                                     tags=run_tags.sweep_tags(sweep_id))
        run_id = run.info.run_id
        self.client.log_batch(run_id, params=[Param(k, v) for k, v in run_tags.sweep_params(spec).items()])
        self.client.log_dict(run_id, spec, "sweep.json")
        return run_id

    def tag_reused_stale(self, run_id: str, segments: int) -> None:
        """Say on a sweep's run that it took over ``segments`` results trained under an older training version."""
        self.client.set_tag(run_id, run_tags.REUSE_STALE, str(segments))

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int) -> None:
        """Log ``metrics`` (already named, e.g. `calibration/coverage_80`) on a run at ``step``; nothing if empty."""
        if metrics:
            self.client.log_batch(run_id, metrics=_metrics(metrics, step))

    def start_segment(self, parent_run_id: str, sweep_id: str, key: str, spec: SegmentSpec,
                      axes: dict[str, Any]) -> str:
        """The run of segment ``key`` under its sweep's run. ``spec`` has its LR resolved (params are immutable:
        they are logged once, here)."""
        tags = {"mlflow.parentRunId": parent_run_id, **run_tags.segment_tags(key, sweep_id)}
        run_id = self.client.create_run(self.experiment_id, run_name=run_tags.run_name(spec, axes),
                                        tags=tags).info.run_id
        self.client.log_batch(run_id, params=_params(run_tags.segment_params(spec, axes)))
        return run_id

    def end_segment(self, run_id: str, status: str, summary: dict[str, float] | None = None, step: int = 0) -> None:
        """Close a segment run (FINISHED, FAILED or KILLED), logging its result once as `summary/*` at ``step``, the
        segment's last token count."""
        metrics = _metrics({SUMMARY + k: v for k, v in (summary or {}).items()}, step)
        self.client.log_batch(run_id, metrics=metrics, tags=[RunTag(run_tags.STATUS, status.lower())])
        self.client.set_terminated(run_id, status)

    def show_reused(self, parent_run_id: str, sweep_id: str, done: Iterable[SegmentRun]) -> int:
        """Give the sweep's run a "(reused)" child for every done segment another sweep trained, once each; returns
        how many were added."""
        children = list(self._children(parent_run_id))
        shown = {r.info.run_id for r in children} | {r.data.tags.get(run_tags.TRAINED_IN_RUN) for r in children}
        added = 0
        for seg in done:
            if seg.run_id in shown:
                continue
            trained = self.client.get_run(seg.run_id)
            link = f"#/experiments/{trained.info.experiment_id}/runs/{seg.run_id}"
            tags = {"mlflow.parentRunId": parent_run_id, **run_tags.segment_tags(seg.key, sweep_id, "reused"),
                    run_tags.TRAINED_IN_RUN: seg.run_id, run_tags.STATUS: "reused",
                    NOTE: f"Trained by an earlier sweep ({trained.data.tags.get(run_tags.SWEEP_ID, '?')}) in run "
                          f"[{trained.info.run_name}]({link}); shown here because this sweep uses it."}
            run_id = self.client.create_run(self.experiment_id, run_name=f"{run_tags.run_name(seg.spec, seg.axes)} "
                                                                          f"(reused)", tags=tags).info.run_id
            summary = [m for key in trained.data.metrics if key.startswith(SUMMARY)
                       for m in self.client.get_metric_history(seg.run_id, key)]
            self.client.log_batch(run_id, metrics=summary, params=_params(run_tags.segment_params(seg.spec, seg.axes)))
            self.client.set_terminated(run_id, "FINISHED")
            shown.add(seg.run_id)
            added += 1
        return added

    def log_observations(self, run_id: str, observations: pd.DataFrame, folder: str = "") -> None:
        """The observations as `<folder>/observations.csv` and as an MLflow dataset input of the run (the UI's
        Datasets column; each distinct table is one dataset version)."""
        import mlflow.data
        from mlflow.entities import DatasetInput, InputTag

        path = f"{folder}/observations.csv" if folder else "observations.csv"
        self.client.log_text(run_id, observations.to_csv(index=False), path)
        artifact_uri = self.client.get_run(run_id).info.artifact_uri
        # MLflow resolves a dataset's source from local paths and file URIs only; a server's proxied artifacts
        # (mlflow-artifacts:) are left as the run's own artifact, named in the CSV path.
        source = f"{artifact_uri}/{path}" if artifact_uri.startswith(("file:", "/")) else None
        ints = {c: "float64" for c in observations.columns if str(observations[c].dtype) == "Int64"}
        with warnings.catch_warnings():  # MLflow warns that a file URI fits two of its (identical) source kinds
            warnings.simplefilter("ignore", UserWarning)
            dataset = mlflow.data.from_pandas(observations.astype(ints), source=source, name="observations")
        inputs = [DatasetInput(dataset._to_mlflow_entity(), [InputTag("mlflow.data.context", folder or "training")])]
        try:
            self.client.log_inputs(run_id, inputs)
        except MlflowException as e:
            # MLflow's store looks the dataset up, then inserts it: two writers logging the same table at once (two
            # schedulers ending one sweep) both insert, and the second hits the unique key. The row now exists, so
            # a second call finds it and only links it to this run.
            if "unique constraint" not in str(e).lower():  # SQLite's and PostgreSQL's wording both
                raise
            self.client.log_inputs(run_id, inputs)

    def end_sweep(self, run_id: str, status: str, summary: dict[str, float], observations: pd.DataFrame,
                  segments_done: int) -> None:
        """Close the sweep's run: its observations, and `sweep/*` numbers at step = segments done (a re-run of a
        failed sweep logs them again further along, never back)."""
        self.log_observations(run_id, observations)
        self.client.log_batch(run_id, metrics=_metrics({"sweep/" + k: v for k, v in summary.items()}, segments_done),
                              tags=[RunTag(run_tags.STATUS, status.lower())])
        self.client.set_terminated(run_id, status)

    def log_analysis(self, parent_run_id: str, record: dict, observations: pd.DataFrame,
                     plot_dir: Path | None) -> None:
        """One analysis of the sweep (fitting/analysis.py's `Analysis.to_json()`) on its parent run: the record as
        `analysis/analysis.json`, its D* and verdict tables as CSV, its observations, its plots (`plot_dir`'s PNG
        and PDF files, subfolders kept, under `analysis/plots/`), a markdown summary as the run's description,
        and the headline numbers as metrics at step n, the parent's n-th analysis (params are immutable; metrics
        keep every analysis's value)."""
        run = self.client.get_run(parent_run_id)
        step = int(run.data.metrics.get(ANALYSIS_COUNT, 0)) + 1
        self.client.log_dict(parent_run_id, record, "analysis/analysis.json")
        dstar, verdicts = _dstar_rows(record), _verdict_rows(record)
        with tempfile.TemporaryDirectory() as tmp:
            _csv(Path(tmp) / "dstar.csv", dstar)
            _csv(Path(tmp) / "verdicts.csv", verdicts)
            self.client.log_artifacts(parent_run_id, tmp, "analysis")
        self.log_observations(parent_run_id, observations, "analysis")
        if plot_dir is not None and Path(plot_dir).is_dir():
            self.client.log_artifacts(parent_run_id, str(plot_dir), "analysis/plots")
        metrics = {ANALYSIS_COUNT: step, **_headline(record)}
        self.client.log_batch(parent_run_id, metrics=_metrics(metrics, step),
                              tags=[RunTag(NOTE, _summary_markdown(record, dstar, verdicts, step))])

    def _children(self, parent_run_id: str) -> Iterator[Any]:
        token = None
        while True:
            page = self.client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'",
                                           max_results=1000, page_token=token)
            yield from page
            token = page.token
            if not token:
                return


def _params(values: dict[str, str]) -> list[Param]:
    return [Param(k, v) for k, v in sorted(values.items())]


def _metrics(values: dict[str, float], step: int) -> list[Metric]:
    now = int(time.time() * 1000)
    return [Metric(k, float(v), now, step) for k, v in values.items() if v is not None]


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
