"""What the CLI and the API call: submit a sweep spec, run it to completion, read its observations.

Routes and commands stay thin: both go through these functions, which own the order of things (validate, plan, record,
schedule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from upscale.orchestrator.hooks import Hooks
from upscale.orchestrator.plan_in_store import PlanInStore, compare
from upscale.orchestrator.records import Base, SweepRecord
from upscale.orchestrator.scheduler import Scheduler, SweepOutcome, cluster_resources
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.store import Store
from upscale.sweeps.planner import Plan, plan
from upscale.sweeps.resources import check_resources
from upscale.sweeps.segments import fingerprint
from upscale.sweeps.spec import SweepSpec


@dataclass
class Orchestrator:
    """A store and the settings it came from; `Orchestrator.open(settings)` migrates the database."""

    store: Store
    settings: Settings

    @classmethod
    def open(cls, settings: Settings, hooks: Hooks | None = None) -> Orchestrator:
        return cls(Store(settings.db_url, hooks), settings)

    def compare(self, p: Plan, reuse_stale: bool = False) -> PlanInStore:
        """What the store holds of plan ``p``: done segments and stale ones (`Store.holdings`)."""
        return compare(self.store, p, reuse_stale)

    def submit(self, spec: SweepSpec, reuse_stale: bool = False) -> SweepRecord:
        """Record ``spec``, planned and compared with the store here (`record`)."""
        return self.record(spec, self.compare(plan(spec), reuse_stale))

    def record(self, spec: SweepSpec, compared: PlanInStore, submission_key: str | None = None,
               rows: Callable[[str], Iterable[Base]] | None = None,
               check: Callable[[Session], None] | None = None) -> SweepRecord:
        """Record ``spec`` with its plan as ``compared`` with the store; segments already known (from any sweep) are
        shared, not re-planned. Segments the store holds trained under an older training-semantics version (its
        ``stale``) are recorded on the sweep and retrained, or with its ``reuse_stale`` taken over from the old ones.
        Segments held under another cut of their chain (its ``other_cuts``) are the same computation and taken over
        always. ``submission_key``, ``rows`` and ``check``: as `Store.create_sweep` takes them (one sweep per
        identical submission, the records written with it, and what must hold when it is written)."""
        p = compared.plan
        return self.store.create_sweep(spec.name, spec.model_dump(mode="json"),
                                       spec.resources.model_dump(mode="json"), p.segments, spec_hash(spec, p),
                                       stale=compared.stale, reuse_stale=compared.reuse_stale,
                                       other_cuts=compared.other_cuts, submission_key=submission_key, rows=rows,
                                       check=check)

    def identical(self, spec: SweepSpec, p: Plan) -> list[SweepRecord]:
        """The sweeps recorded from a spec identical to ``spec`` that planned the segments ``p`` plans, newest first."""
        return self.store.sweeps_with_spec(spec_hash(spec, p))

    def sweep_to_run(self, spec: SweepSpec, compared: PlanInStore, sweep_id: str | None = None) -> str:
        """The sweep that trains ``spec`` once the cluster is found to have the resources it asks for: ``sweep_id``
        (recorded from it; with ``compared.reuse_stale`` its stale segments taken over), or else a new one recorded
        with ``compared``."""
        check_resources(spec, cluster_resources(self.settings))
        if sweep_id is None:
            return self.record(spec, compared).id
        if compared.reuse_stale and compared.stale:
            self.store.adopt_stale(sweep_id, compared.stale)
        return sweep_id

    def run(self, spec: SweepSpec, scheduler: Scheduler | None = None, sweep_id: str | None = None,
            reuse_stale: bool = False) -> SweepOutcome:
        """Submit ``spec`` (or resume ``sweep_id``, recorded from it) and train it to completion on Ray (embedded
        unless RAY_ADDRESS is set) with ``scheduler`` (a default one if none); with ``reuse_stale``, segments held
        only under an older training-semantics version are taken over instead of trained (a resumed sweep's too).
        The road that runs a sweep for the CLI, the server and the bench scripts is control/runs.py."""
        sweep_id = self.sweep_to_run(spec, self.compare(plan(spec), reuse_stale), sweep_id)
        return (scheduler or Scheduler(self.store, self.settings)).run(sweep_id)


def spec_hash(spec: SweepSpec, p: Plan) -> str:
    """What makes two submissions the same sweep: the same validated spec planning the same segment keys. The keys
    carry what the spec's text does not: the content of its corpus, tokenizer and imported model, and the
    training-semantics version, so the same spec over changed data, or after a version bump, is a new sweep."""
    return fingerprint({"spec": spec, "segments": sorted(s.id for s in p.segments)})
