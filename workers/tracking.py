"""MLflow logging for one segment: metrics buffered and sent with `log_batch`, never one point at a time.

On SQLite one `log_metric` costs ~3 ms while a `log_batch` of 200 points sends ~12,800 points/s (docs/architecture.md,
"Measured facts"), so points are buffered and flushed every `flush_every` points and at close. Steps are tokens
seen, so every metric history is a curve over training tokens.

Metric names follow how MLflow's UI lays out charts: it groups a run's metrics into sections by the prefix before
the last `/`, puts the prefixed sections first in alphabetical order and the unprefixed ones ("Model metrics")
after them. The losses are therefore `loss/train` and `loss/val`, ahead of `moe/...` (the auxiliary loss, the
per-expert load), `optim/...` and `speed/...` (`CHART_NAMES`).

A retried attempt resumes from the segment's last checkpoint and trains again the steps after it that the failed
attempt had already logged: points at steps the run already holds are not sent again, so each history stays one
curve in step order. The run is the orchestrator's (`SegmentRuntime.mlflow_run_id`, its name, params and tags
already set) or, when
the segment runs alone, a new run in the `upscale` experiment with the name, params and tags given here. With no
tracking URI every call is a no-op, so the training loop never branches on whether MLflow is on.

Logging is best effort: a tracking store that cannot be opened, read or written (read-only, deleted, a server down)
costs the dashboard its points, never the segment: the failure is logged once and the logger goes on as a no-op.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch request
EXPERIMENT = "upscale"
# MLflow 3 opens an experiment in the view its kind names; this one is the model-training view (not GenAI's).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# Its UI does not read that tag: a page opens in the view its `workflowType` URL parameter names, else the browser's
# last choice, else GenAI's. Links upscale writes carry the parameter (`run_link`); api/mlflow_ui.py sets the default.
MODEL_TRAINING_VIEW = "machine_learning"

CHART_NAMES = {"train_loss": "loss/train", "val_loss": "loss/val", "aux_loss": "moe/aux_loss",
               "load_max_over_mean": "moe/load_max_over_mean", "lr": "optim/lr", "grad_norm": "optim/grad_norm",
               "nan_step": "optim/nan_step", "tokens_per_s": "speed/tokens_per_s"}


def run_link(experiment_id: str, run_id: str) -> str:
    """A link to a run inside the MLflow UI (relative: it works on whatever server shows it), in its training view."""
    return f"#/experiments/{experiment_id}/runs/{run_id}?workflowType={MODEL_TRAINING_VIEW}"


def experiment_link(experiment_id: str) -> str:
    """A link to the experiment's runs table inside the MLflow UI (relative, as `run_link`): the sweeps' runs, newest
    first, not MLflow's landing page."""
    return f"#/experiments/{experiment_id}"


def chart_name(key: str) -> str:
    """The MLflow name of a worker's metric: `loss/...` first, the per-expert `load/...` under `moe/`."""
    return "moe/" + key if key.startswith("load/") else CHART_NAMES.get(key, key)


def artifact_root_for(tracking_uri: str) -> str | None:
    """Where a store keeps artifacts when nobody says: beside a SQLite file (`<dir>/mlartifacts`), never the
    working directory; a tracking server (or a file store) decides for itself (None)."""
    prefix = "sqlite:///"  # then the file's path: absolute with a 4th slash, else relative to the working directory
    path = tracking_uri[len(prefix):] if tracking_uri.startswith(prefix) else ""
    if path and path != ":memory:":
        return (Path(path).absolute().parent / "mlartifacts").as_uri()
    return None


def client_for(tracking_uri: str) -> Any:
    """An MlflowClient that keeps stdout clean: against a server MLflow 3 prints every ended run's URL there, and the
    CLI's stdout carries only its results (`upscale run --json`)."""
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def ensure_experiment(client: Any, artifact_location: str | None, name: str = EXPERIMENT) -> str:
    """The experiment's id, creating it with its artifact location and MLflow 3's model-training kind; an existing
    one keeps its location (MLflow cannot move it) and gets the kind only if it has none."""
    found = client.get_experiment_by_name(name)
    if found is None:
        return client.create_experiment(name, artifact_location=artifact_location,
                                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    if EXPERIMENT_KIND_TAG not in found.tags:
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return found.experiment_id


def last_step(client: Any, run_id: str) -> int:
    """The highest step logged to the run so far, -1 for none: one read of the run, and of each history only when
    it has metrics (a resumed attempt's)."""
    keys = client.get_run(run_id).data.metrics
    return max((m.step for k in keys for m in client.get_metric_history(run_id, k)), default=-1)


class MetricLogger:
    """Buffer (key, value, step) points and send them in batches to one MLflow run."""

    def __init__(self, tracking_uri: str | None, run_id: str | None, *, run_name: str,
                 params: dict[str, str] | None = None, tags: dict[str, str] | None = None,
                 flush_every: int = 200) -> None:
        """``run_name``, ``params`` and ``tags`` describe the run this logger creates when ``run_id`` is None; an
        existing run is logged into as it is (its creator named and described it)."""
        self.flush_every = min(flush_every, MAX_BATCH)
        self._points: list[Any] = []
        self.client = None
        self.run_id = run_id
        self.owns_run = run_id is None
        self.logged_through = -1  # the highest step the run already holds (a resumed attempt's)
        if tracking_uri is None:
            return
        from mlflow.entities import Param, RunTag

        try:
            self.client = client_for(tracking_uri)
            if run_id is not None:
                self.logged_through = last_step(self.client, run_id)
            else:
                exp_id = ensure_experiment(self.client, artifact_root_for(tracking_uri))
                self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
                self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in sorted((params or {}).items())],
                                      tags=[RunTag(k, str(v)) for k, v in sorted((tags or {}).items())])
        except Exception as e:  # whatever MLflow raises, the segment trains on
            self._give_up("open", e)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Queue one point per metric at `step` (tokens seen), under its chart name; sent when the buffer is full
        or at `close`."""
        if self.client is None:
            return
        from mlflow.entities import Metric

        if step <= self.logged_through:
            return
        now = int(time.time() * 1000)
        self._points.extend(Metric(chart_name(k), float(v), now, step) for k, v in metrics.items())
        if len(self._points) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        while self._points and self.client is not None:
            batch, self._points = self._points[:MAX_BATCH], self._points[MAX_BATCH:]
            try:
                self.client.log_batch(self.run_id, metrics=batch)
            except Exception as e:  # whatever MLflow raises, the segment trains on
                self._give_up("log_batch", e)

    def close(self, status: str = "FINISHED") -> None:
        """Flush, and end the run if this logger created it (an orchestrator's run is ended by the orchestrator)."""
        self.flush()
        if self.client is not None and self.owns_run:
            try:
                self.client.set_terminated(self.run_id, status=status)
            except Exception as e:  # whatever MLflow raises, the segment's result stands
                self._give_up("set_terminated", e)

    def _give_up(self, call: str, e: BaseException) -> None:
        """MLflow failed: say so once and log nothing more (the dashboard misses this segment's curves)."""
        log.warning("MLflow %s failed; this segment's metrics are not logged: %s", call,
                    traceback.format_exception_only(e)[-1].strip()[:500])
        self.client, self._points = None, []

    def __enter__(self) -> MetricLogger:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close("FAILED" if exc_type else "FINISHED")
