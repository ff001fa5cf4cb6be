"""What the CLI and the API call: submit a sweep spec, run it to completion, read its observations.

Routes and commands stay thin: both go through these functions, which own the order of things (validate, plan, record,
schedule).
"""

from __future__ import annotations

from dataclasses import dataclass

from upscale.orchestrator.records import SweepRecord
from upscale.orchestrator.scheduler import Scheduler, SweepOutcome, cluster_resources
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.store import Store
from upscale.sweeps.planner import Plan, plan
from upscale.sweeps.segments import fingerprint
from upscale.sweeps.spec import SweepSpec, check_resources


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
                                       spec.resources.model_dump(mode="json"), p.segments, spec_hash(spec))

    def identical(self, spec: SweepSpec) -> list[SweepRecord]:
        """The sweeps recorded from a spec identical to ``spec``, newest first."""
        return self.store.sweeps_with_spec(spec_hash(spec))

    def run(self, spec: SweepSpec, scheduler: Scheduler | None = None, sweep_id: str | None = None) -> SweepOutcome:
        """Submit ``spec`` (or resume ``sweep_id``, recorded from it) and train it to completion on Ray (embedded
        unless RAY_ADDRESS is set)."""
        check_resources(spec, cluster_resources(self.settings))
        sweep_id = sweep_id or self.submit(spec).id
        return (scheduler or Scheduler(self.store, self.settings)).run(sweep_id)


def spec_hash(spec: SweepSpec) -> str:
    """What makes two submissions the same sweep: the hash of the validated spec's canonical JSON."""
    return fingerprint(spec)
