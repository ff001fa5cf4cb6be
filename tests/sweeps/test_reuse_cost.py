"""Finding a plan's segments under other cuts costs keys in proportion to what the store could hold: nothing but the
parentless trunks' cuts in an empty store (an 18,000-segment grid plans and is compared in seconds, once minutes),
at most MAX_OTHER_KEYS a segment when the store holds every parent, and a segment held under another key is found
through its parent's other key."""

from __future__ import annotations

import copy

from tests.sweeps.conftest import SMALL_SPEC
from upscale.sweeps.planner import plan
from upscale.sweeps.reuse import MAX_OTHER_KEYS, other_cuts
from upscale.sweeps.segments import TRUNK_KINDS
from upscale.sweeps.spec import parse_spec, segment_bound


def _grid(experts: int, budgets: int) -> dict:
    return {**copy.deepcopy(SMALL_SPEC), "moe": {"experts": list(range(2, 2 + experts)), "topk": [1, 2]},
            "upcycling": {"methods": ["naive", "noise", "drop"], "r": [0.25, 0.5]},
            "tokens": {"d1": [20480 * (i + 1) for i in range(budgets)],
                       "d2": [20480 * (i + 1) for i in range(budgets)]}}


class Asked:
    """A store's answer (``found``) to every batch asked, counting the candidate keys."""

    def __init__(self, found: dict[str, str] | None = None) -> None:
        self.keys, self.found = 0, found or {}

    def __call__(self, asked: dict[str, tuple[str, ...]]) -> dict[str, str]:
        self.keys += sum(len(v) for v in asked.values())
        return {k: self.found[k] for k in asked if k in self.found and self.found[k] in asked[k]}


def test_an_18k_segment_grid_asks_only_the_parentless_trunks_of_an_empty_store() -> None:
    spec = parse_spec(_grid(15, 9))
    p = plan(spec)
    assert len(p.segments) == segment_bound(spec) > 18_000
    asked = Asked()
    assert other_cuts(p.segments, set(), asked) == {}
    roots = [s for s in p.segments if s.spec.kind in TRUNK_KINDS and not s.spec.parent_ids]
    assert 0 < asked.keys <= len(roots) * MAX_OTHER_KEYS * 9


def test_a_store_holding_every_parent_is_asked_at_most_a_bounded_number_of_keys_a_segment() -> None:
    p = plan(parse_spec(_grid(2, 3)))
    asked = Asked()
    other_cuts(p.segments, {s.id for s in p.segments}, asked)
    assert 0 < asked.keys <= MAX_OTHER_KEYS * len(p.segments)


def test_a_job_held_under_a_coarser_cut_is_found_and_so_are_its_descendants() -> None:
    """The grid grown by an interior D1: the store holds the old grid, whose dense pieces and what descends from
    them have other keys; each is found under the old grid's key for the same job."""
    old = plan(parse_spec({**copy.deepcopy(SMALL_SPEC), "tokens": {"d1": [20480, 61440], "d2": [20480]}}))
    new = plan(parse_spec({**copy.deepcopy(SMALL_SPEC), "tokens": {"d1": [20480, 40960, 61440], "d2": [20480]}}))
    held = {s.id for s in old.segments}
    done = held & {s.id for s in new.segments}
    old_ids = {(s.spec.kind, s.spec.end_tokens, s.axes["D1"], s.axes["D2"]): s.id for s in old.segments}

    def store(asked: dict[str, tuple[str, ...]]) -> dict[str, str]:
        return {k: next(o for o in v if o in held) for k, v in asked.items() if any(o in held for o in v)}

    found = other_cuts(new.segments, done, store)
    by_id = {s.id: s for s in new.segments}
    same_job = {k: old_ids.get((by_id[k].spec.kind, by_id[k].spec.end_tokens, by_id[k].axes["D1"],
                                by_id[k].axes["D2"])) for k in found}
    assert found and found == same_job
    assert {by_id[k].spec.kind for k in found} >= {"dense_trunk", "dense_decay", "upcycle", "moe_trunk", "moe_decay"}
