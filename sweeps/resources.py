"""What a cluster offers, and the check that a sweep's segments fit in it: sweeps/ stays pure by taking the cluster's
resources as an argument (the orchestrator reads them from Ray).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from upscale.sweeps.errors import raise_if
from upscale.sweeps.segments import Frozen

if TYPE_CHECKING:
    from upscale.sweeps.spec import SweepSpec


class ClusterResources(Frozen):
    """What a cluster offers (the orchestrator reads it from Ray); sweeps/ stays pure by taking it as an argument."""

    cpus: float = Field(ge=0)
    gpus: float = Field(0, ge=0)
    node_memory: float | None = Field(None, ge=0, description="Bytes of Ray's `memory` resource on its largest "
                                      "node: the most one worker process can hold; None when not known.")


def check_resources(spec: SweepSpec, available: ClusterResources) -> None:
    """Refuse a sweep whose segments need more than the cluster has (raises SpecError)."""
    r = spec.resources
    problems = [(f"resources.{name}", f"a segment needs {need:g} {name} ({per:g} x {r.workers} workers); the "
                 f"cluster has {have:g}")
                for name, per, have in (("cpus", r.cpus, available.cpus), ("gpus", r.gpus, available.gpus))
                if (need := per * r.workers) > have]
    raise_if(problems)
