"""What the CLI and the API call: submit a sweep spec, run it to completion, read its observations.

Routes and commands stay thin: both go through these functions, which own the order of things (validate, plan, record,
schedule).
"""

from __future__ import annotations

from dataclasses import dataclass

from upscale.orchestrator.records import SweepRecord
from upscale.orchestrator.scheduler import Scheduler, SweepOutcome, ensure_ray
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.store import Store
from upscale.sweeps.planner import Plan, plan
from upscale.sweeps.spec import ClusterResources, SweepSpec, check_resources


@dataclass
class Orchestrator:
    """A store and the settings it came from; `Orchestrator.open(settings)` migrates the database."""

    store: Store
    settings: Settings

    @classmethod
    def open(cls, settings: Settings) -> Orchestrator:
        return cls(Store(settings.db_url), settings)

    def submit(self, spec: SweepSpec, planned: Plan | None = None) -> SweepRecord:
        """Record ``spec`` with its plan (planned here unless the caller has it); segments already known (from any
        sweep) are shared, not re-planned."""
        p = planned or plan(spec)
        return self.store.create_sweep(spec.name, spec.model_dump(mode="json"),
                                       spec.resources.model_dump(mode="json"), p.segments)

    def run(self, spec: SweepSpec, scheduler: Scheduler | None = None) -> SweepOutcome:
        """Submit ``spec`` and train it to completion on Ray (embedded unless RAY_ADDRESS is set)."""
        ensure_ray(self.settings)
        import ray

        have = ray.cluster_resources()
        check_resources(spec, ClusterResources(cpus=have.get("CPU", 0), gpus=have.get("GPU", 0)))
        sweep = self.submit(spec)
        return (scheduler or Scheduler(self.store, self.settings)).run(sweep.id)
