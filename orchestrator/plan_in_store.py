"""A plan compared with the state store: what of it is done, what is stale, and what running it trains.

`upscale plan`, `upscale run` and POST /sweeps report the same figures from here: the whole plan's segments, tokens
and FLOPs, and the `new_*` ones of the segments not yet done in the store (whatever the DAG looks like: the store is
matched by segment key). Light on purpose (no Ray): `upscale plan` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from upscale.orchestrator.store import Store
from upscale.sweeps.planner import Plan, PlannedSegment, unversioned_ids


@dataclass(frozen=True)
class PlanInStore:
    """A plan compared with what the store holds: its segments done there, and those the store holds only trained
    under another training-semantics version (stale: planned key -> the stale segment's key)."""

    plan: Plan
    done: frozenset[str] = frozenset()
    stale: dict[str, str] = field(default_factory=dict)
    reuse_stale: bool = False  # stale results are taken over, not retrained

    def to_train(self) -> list[PlannedSegment]:
        """The plan's segments that running it trains: not done, and not stale unless stale results are reused."""
        held = self.done | (set(self.stale) if self.reuse_stale else set())
        return [s for s in self.plan.segments if s.id not in held]

    def figures(self) -> dict[str, Any]:
        """Segments, tokens and FLOPs of the whole plan and of what it trains (`new_*`), the independent-runs cost
        and saving of the whole plan, and the stale segments."""
        p, new = self.plan, self.to_train()
        return {"segments": len(p.segments), "new_segments": len(new),
                "tokens": sum(s.tokens for s in p.segments), "new_tokens": sum(s.tokens for s in new),
                "flops": p.total_flops, "new_flops": sum(s.flops for s in new),
                "independent_flops": p.independent_flops, "saving": p.saving,
                "stale_segments": len(self.stale), "stale": dict(self.stale), "reuse_stale": self.reuse_stale}


def compare(store: Store, p: Plan, reuse_stale: bool = False) -> PlanInStore:
    """What ``store`` holds of plan ``p``: done segments and stale ones (`Store.holdings`)."""
    done, stale = store.holdings(unversioned_ids(p.segments))
    return PlanInStore(p, frozenset(done), stale, reuse_stale)
