"""The MLflow run tree, MLflow as upscale's dashboard: one parent run per sweep, one child run per segment.

* The experiment `upscale` is created with its artifact location (`Settings.mlflow_artifact_root`: under
  UPSCALE_HOME by default, the server's when tracking goes to a server; never the working directory) and MLflow 3's
  experiment-kind tag for the model-training view.
* A sweep's parent run is named after the sweep and holds its spec (`sweep.json`, and flattened as params), the
  observations (`observations.csv` and an MLflow dataset input), and the sweep's own analyses, each under
  `analyses/<id>/` (control/analysis_run.py, which also gives other analyses runs of their own under it).
* A segment's child run is named after its kind and grid axes, with its configuration as params and only its ids
  and state as tags (sweeps/run_tags.py, which the worker uses for a segment trained alone). The orchestrator
  creates it and hands its id to the worker (`SegmentRuntime.mlflow_run_id`), which logs the curves (step = tokens
  seen); when it ends the orchestrator logs the result once, as `summary/*` at the segment's last token count, so
  no curve gets a point back at step 0.
* A decay's run (one observation) also holds its whole training path as one curve per loss, `loss/path_train`
  and `loss/path_val`: the losses its ancestors' runs logged (dense trunk pieces, dense decay, upcycle, MoE trunk
  pieces), then its own, at step = tokens the model has seen since its random init (orchestrator/training_path.py),
  and a description listing the path; so the chart view compares observations as whole curves. Each ancestor is
  copied into every observation it leads to.
* A segment shared by several sweeps is trained once, under the sweep that trained it; every other sweep's parent
  gets a "(reused)" child with the same params, the trained run's summary metrics and a link to it, so each
  sweep's tree is complete (a decay's path curves too).
* MLflow is the dashboard, never a dependency: the scheduler makes its calls through `BestEffortTracker`, which logs
  and skips a failing call, re-creates a run the tracking store no longer has, and opens a SQLite tracking file
  anew once it has been deleted. Losing mlflow.db loses the dashboard's history, nothing else.
"""

from __future__ import annotations

import logging
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from upscale.orchestrator.training_path import PathStep
from upscale.sweeps import run_tags
from upscale.sweeps.segments import SegmentSpec
from upscale.workers.tracking import EXPERIMENT, MAX_BATCH, client_for, ensure_experiment, experiment_link, run_link

if TYPE_CHECKING:
    import pandas as pd

    from upscale.orchestrator.settings import Settings

log = logging.getLogger(__name__)

SUMMARY = "summary/"  # a segment's result, logged once: its own names, so the curves stay curves
# On a decay's run: the losses of its whole training path, step = tokens since the random init. Under `loss/`, named
# so that MLflow's UI (charts of a section in name order) shows them before the segment's own `loss/train`.
PATH_CURVES = {"loss/train": "loss/path_train", "loss/val": "loss/path_val"}
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
            self.client.log_batch(run_id, metrics=metrics_at(metrics, step))

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
        metrics = metrics_at({SUMMARY + k: v for k, v in (summary or {}).items()}, step)
        self.client.log_batch(run_id, metrics=metrics, tags=[RunTag(run_tags.STATUS, status.lower())])
        self.client.set_terminated(run_id, status)

    def log_path(self, run_id: str, path: Sequence[PathStep]) -> None:
        """Log onto a decay's run (``run_id``, the path's last step) the losses of its whole ``path`` as
        `loss/path_*` curves over tokens since the random init, one point per step (the first segment's where two
        meet), and describe the path in the run's description."""
        curves: dict[str, dict[int, Metric]] = {name: {} for name in PATH_CURVES.values()}
        lines = []
        for step in path:
            if step.run_id is None:
                continue
            for key, name in PATH_CURVES.items():
                for m in self.client.get_metric_history(step.run_id, key):
                    if step.start_tokens <= m.step <= step.end_tokens:
                        curves[name].setdefault(m.step + step.offset, Metric(name, m.value, m.timestamp,
                                                                             m.step + step.offset))
            run = self.client.get_run(step.run_id).info.run_name
            lines.append(f"1. [{run}]({run_link(self.experiment_id, step.run_id)}): tokens "
                         f"{step.offset + step.start_tokens:,}–{step.offset + step.end_tokens:,}")
        points = [m for name in sorted(curves) for _, m in sorted(curves[name].items())]
        note = ("**The path to this observation**, as one curve over tokens in `loss/path_train` and `loss/path_val` "
                "(step = tokens the model has seen since its random init; `loss/*` count this segment's own "
                "schedule):\n\n" + "\n".join(lines))
        self._log_points(run_id, points)
        self.client.set_tag(run_id, NOTE, note)

    def _log_points(self, run_id: str, points: Sequence[Metric]) -> None:
        for at in range(0, len(points), MAX_BATCH):
            self.client.log_batch(run_id, metrics=points[at:at + MAX_BATCH])

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
            link = run_link(trained.info.experiment_id, seg.run_id)
            tags = {"mlflow.parentRunId": parent_run_id, **run_tags.segment_tags(seg.key, sweep_id, "reused"),
                    run_tags.TRAINED_IN_RUN: seg.run_id, run_tags.STATUS: "reused",
                    NOTE: f"Trained by an earlier sweep ({trained.data.tags.get(run_tags.SWEEP_ID, '?')}) in run "
                          f"[{trained.info.run_name}]({link}); shown here because this sweep uses it."}
            run_id = self.client.create_run(self.experiment_id, run_name=f"{run_tags.run_name(seg.spec, seg.axes)} "
                                                                          f"(reused)", tags=tags).info.run_id
            copied = [m for key in trained.data.metrics if key.startswith(SUMMARY) or key in PATH_CURVES.values()
                      for m in self.client.get_metric_history(seg.run_id, key)]
            self.client.log_batch(run_id, params=_params(run_tags.segment_params(seg.spec, seg.axes)))
            self._log_points(run_id, copied)
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
        self.client.log_batch(run_id, metrics=metrics_at({"sweep/" + k: v for k, v in summary.items()}, segments_done),
                              tags=[RunTag(run_tags.STATUS, status.lower())])
        self.client.set_terminated(run_id, status)

    def _children(self, parent_run_id: str) -> Iterator[Any]:
        token = None
        while True:
            page = self.client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'",
                                           max_results=1000, page_token=token)
            yield from page
            token = page.token
            if not token:
                return


def ui_address(settings: Settings, port: int = 5000) -> str:
    """Where `upscale ui --launch` (on ``port``) shows the sweeps' runs: the experiment's runs table."""
    return f"http://127.0.0.1:{port}/{experiment_link(RunTree.for_settings(settings).experiment_id)}"


class BestEffortTracker:
    """The scheduler's `RunTree`, best effort: any of its methods called here that fails (a read-only, locked or
    deleted mlflow.db, a tracking server down) is logged and skipped, returning None, and the tree is opened again
    on the next call. Training and a sweep's status never wait on the dashboard."""

    def __init__(self, settings: Settings, tree: RunTree | None = None) -> None:
        self.settings, self._tree = settings, tree

    def _open(self) -> RunTree:
        if self._tree is None:
            self._tree = RunTree.for_settings(self.settings)
        return self._tree

    def exists(self, run_id: str | None) -> bool:
        """Whether the tracking store still has run ``run_id`` (False for None: there is none to log into). True
        when the store cannot say (unreachable), so an outage never makes duplicate runs."""
        if run_id is None:
            return False
        try:
            self._open().client.get_run(run_id)
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            self._skipped("get_run", e)
        except Exception as e:  # MLflow unreachable: assume the run is there
            self._skipped("get_run", e)
        return True

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(RunTree, name)  # only RunTree's methods: an unknown name is an AttributeError

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(self._open(), *args, **kwargs)
            except Exception as e:  # whatever MLflow raises, training goes on
                self._skipped(name, e)
                return None

        return call

    def _skipped(self, name: str, e: BaseException) -> None:
        log.warning("MLflow %s skipped (the dashboard misses it, training goes on): %s", name,
                    traceback.format_exception_only(e)[-1].strip()[:500])
        self._tree = None
        forget_sqlite_store(self.settings.mlflow_tracking_uri)


def forget_sqlite_store(tracking_uri: str) -> None:
    """Drop MLflow's cached store and engine of a SQLite tracking file after a failure: once the file is deleted,
    the cached engine keeps the unlinked file open (reads work, every write fails) or opens an empty file in its
    place, for as long as the process lives. Without them the next client makes the file and its schema anew."""
    if not tracking_uri.startswith("sqlite:"):
        return
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    _tracking_store_registry._get_store_with_resolved_uri.cache_clear()
    engine = SqlAlchemyStore._engine_map.pop(tracking_uri, None)
    if engine is not None:
        engine.dispose()


def _params(values: dict[str, str]) -> list[Param]:
    return [Param(k, v) for k, v in sorted(values.items())]


def metrics_at(values: dict[str, float], step: int) -> list[Metric]:
    """MLflow metrics of ``values`` at ``step`` (now), leaving out the None ones."""
    now = int(time.time() * 1000)
    return [Metric(k, float(v), now, step) for k, v in values.items() if v is not None]
