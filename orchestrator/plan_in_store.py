"""A plan compared with the state store: what of it is done, what is stale, and what running it trains.

`upscale plan`, `upscale run` and POST /sweeps report the same figures from here: the whole plan's segments, tokens
and FLOPs, and the `new_*` ones of the segments not yet done in the store (whatever the DAG looks like: the store is
matched by segment key, and by the other keys of the same jobs: sweeps/reuse.py). Light on purpose (no Ray): `upscale
plan` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from upscale.sweeps.planner import Plan, PlannedSegment
from upscale.sweeps.reuse import other_cuts, unversioned_ids
from upscale.sweeps.segments import TRUNK_KINDS

if TYPE_CHECKING:  # SQLAlchemy: a plan with no store to compare with (a base-only install) needs none
    from upscale.orchestrator.store import Store


@dataclass(frozen=True)
class PlanInStore:
    """A plan compared with what the store holds: its segments done there, those the store holds only trained under
    another training-semantics version (stale: planned key -> the stale segment's key), and those it holds under
    another key of the same job (other_cuts: planned key -> that key, `reuse.other_cuts`: another cut of its chain;
    the same computation, so always taken over, `Store.create_sweep`)."""

    plan: Plan
    done: frozenset[str] = frozenset()
    stale: dict[str, str] = field(default_factory=dict)
    reuse_stale: bool = False  # stale results are taken over, not retrained
    other_cuts: dict[str, str] = field(default_factory=dict)

    def to_train(self) -> list[PlannedSegment]:
        """The plan's segments that running it trains: not done, and not stale unless stale results are reused."""
        held = self.done | set(self.other_cuts) | (set(self.stale) if self.reuse_stale else set())
        return [s for s in self.plan.segments if s.id not in held]

    def figures(self) -> dict[str, Any]:
        """Segments, tokens and FLOPs of the whole plan and of what it trains (`new_*`), the independent-runs cost
        and saving of the whole plan, the stale segments and how many are held under another cut of their chain."""
        p, new = self.plan, self.to_train()
        return {"segments": len(p.segments), "new_segments": len(new),
                "tokens": sum(s.tokens for s in p.segments), "new_tokens": sum(s.tokens for s in new),
                "flops": p.total_flops, "new_flops": sum(s.flops for s in new),
                "independent_flops": p.independent_flops, "saving": p.saving,
                "stale": dict(self.stale), "reuse_stale": self.reuse_stale,
                "other_cut_segments": len(self.other_cuts)}


def compare(store: Store, p: Plan, reuse_stale: bool = False) -> PlanInStore:
    """What ``store`` holds of plan ``p``: done segments, stale ones (`Store.holdings`) and those held under another
    cut of their chain (`Store.other_cut_holdings`)."""
    done, stale = store.holdings(unversioned_ids(p.segments))
    ends = {s.id: s.spec.end_tokens for s in p.segments if s.spec.kind in TRUNK_KINDS}
    cuts = other_cuts(p.segments, done, lambda asked: store.other_cut_holdings(
        {k: v for k, v in asked.items() if k not in done}, ends))
    return PlanInStore(p, frozenset(done), {k: v for k, v in stale.items() if k not in cuts}, reuse_stale, cuts)
