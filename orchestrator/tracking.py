"""The MLflow run tree: one parent run per sweep, one child run per segment, tagged with every grid axis.

The orchestrator creates the runs and hands the child's id to the worker (`SegmentRuntime.mlflow_run_id`), which logs
its metrics into it; observations keep the run id. A segment shared by several sweeps has one run, under the sweep
that first trained it, and is tagged with its content key so any sweep can find it. The tag names are
sweeps/run_tags.py's, shared with the worker.
"""

from __future__ import annotations

import time
from typing import Any

from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from upscale.sweeps import run_tags
from upscale.sweeps.segments import SegmentSpec

EXPERIMENT = "upscale"


class RunTree:
    """Creates and closes the sweep and segment runs in one MLflow experiment."""

    def __init__(self, tracking_uri: str, experiment: str = EXPERIMENT) -> None:
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)

    def start_sweep(self, sweep_id: str, name: str, spec: dict[str, Any]) -> str:
        run = self.client.create_run(self.experiment_id, run_name=f"sweep {name}", tags=run_tags.sweep_tags(sweep_id))
        self.client.log_dict(run.info.run_id, spec, "sweep.json")
        return run.info.run_id

    def start_segment(self, parent_run_id: str, spec: SegmentSpec, axes: dict[str, Any]) -> str:
        """The run of the segment ``spec`` (its key is its id), tagged as its worker tags it (sweeps/run_tags.py)."""
        tags = {"mlflow.parentRunId": parent_run_id, **run_tags.segment_tags(spec), **run_tags.axis_tags(axes)}
        return self.client.create_run(self.experiment_id, run_name=f"{spec.kind} {spec.id}", tags=tags).info.run_id

    def end_segment(self, run_id: str, status: str, metrics: dict[str, float] | None = None) -> None:
        """Close a segment run (FINISHED, FAILED or KILLED), logging its summary metrics in one batch."""
        if metrics:
            self.client.log_batch(run_id, metrics=_metrics(metrics))
        self.client.set_terminated(run_id, status)

    def end_sweep(self, run_id: str, status: str, summary: dict[str, float]) -> None:
        self.client.log_batch(run_id, metrics=_metrics(summary),
                              tags=[RunTag(run_tags.STATUS, status)])
        self.client.set_terminated(run_id, status)


def _metrics(values: dict[str, float]) -> list[Metric]:
    now = int(time.time() * 1000)
    return [Metric(k, float(v), now, 0) for k, v in values.items()]
