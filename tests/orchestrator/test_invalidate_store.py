"""`Store.invalidate` on SQLite and PostgreSQL: the segment and everything trained from it, in every sweep that holds
them and through segments that took its result over, go back to pending in one transaction; a running descendant
refuses it (nothing changed), and so does a segment that is not done.

Strategy: the tiny plan recorded in two sweeps and driven to done by hand (claim, complete), no Ray."""

from __future__ import annotations

import pytest

from tests.orchestrator.test_store import _result, store, tiny  # noqa: F401  (fixtures: SQLite, PostgreSQL)
from upscale.orchestrator.errors import ConflictError, NotFoundError
from upscale.orchestrator.records import CheckpointRecord, ObservationRecord
from upscale.orchestrator.store import Store


def trained(into: Store, segments) -> None:
    for s in segments:
        attempt = into.claim(s.id, "h:1:a")
        assert attempt is not None and into.complete(s.id, attempt, _result(s))


def descendants(plan, key: str) -> set[str]:
    found = {key}
    for s in plan.segments:  # topological: parents come first
        if found.intersection(s.spec.parent_ids):
            found.add(s.id)
    return found


def test_invalidate_marks_the_segment_and_its_descendants_pending_in_every_sweep(store: Store, tiny) -> None:  # noqa: F811
    whole = store.create_sweep("whole", {}, {"cpus": 1}, tiny.segments)
    part = store.create_sweep("part", {}, {"cpus": 1}, tiny.segments[:5])
    trained(store, tiny.segments)
    for sweep in (whole, part):
        store.set_sweep(sweep.id, status="done")
    target = next(s for s in tiny.segments if s.spec.kind == "upcycle")
    expected = descendants(tiny, target.id)
    with store.transaction() as s:
        observations = s.query(ObservationRecord).count()

    done = store.invalidate(target.id, "carol")
    assert set(done.segments) == expected and 1 < len(expected) < len(tiny.segments)
    holding = [whole.id] + ([part.id] if expected & {s.id for s in tiny.segments[:5]} else [])
    assert done.sweeps == sorted(holding)
    assert store.sweep(whole.id).status == "pending" and "carol" in store.sweep(whole.id).error
    for seg in store.segments([s.id for s in tiny.segments]).values():
        assert seg.status == ("pending" if seg.key in expected else "done"), seg.key
    with store.transaction() as s:
        assert s.query(CheckpointRecord).filter(CheckpointRecord.segment_key.in_(expected)).count() == 0
        lost = sum(1 for k in expected if store.segment(k).observation)
        assert lost and s.query(ObservationRecord).count() == observations - lost
    assert store.attempts(target.id)[-1].status == "invalidated" and store.attempts(target.id)[-1].owner == "carol"

    with pytest.raises(ConflictError, match="only a done segment"):
        store.invalidate(target.id, "carol")
    with pytest.raises(NotFoundError):
        store.invalidate("0" * 16, "carol")


def test_a_running_descendant_refuses_it_and_nothing_changes(store: Store, tiny) -> None:  # noqa: F811
    store.create_sweep("whole", {}, {"cpus": 1}, tiny.segments)
    target = tiny.segments[0]  # the first trunk piece
    below = descendants(tiny, target.id)
    leaf = [s for s in tiny.segments if s.id in below][-1]  # trained from it, and the parent of nothing
    trained(store, [s for s in tiny.segments if s.id != leaf.id])
    assert store.claim(leaf.id, "h:2:b") is not None  # still training
    removed: list[str] = []
    with pytest.raises(ConflictError, match=f"{leaf.id} are running"):
        store.invalidate(target.id, "carol", before_commit=removed.extend)
    assert removed == []  # no checkpoint deleted either
    assert store.segment(target.id).status == "done" and store.segment(leaf.id).status == "running"


def test_concurrent_invalidations_of_one_segment_are_one_and_the_losers_remove_nothing(store: Store, tiny) -> None:  # noqa: F811
    """Four invalidations at once (the removal of checkpoints slowed, so all four are inside it together unless they
    are serialised): one succeeds, the others are a ConflictError, not an IntegrityError on the attempt number, and
    only the winner's `before_commit` runs."""
    import threading
    import time

    store.create_sweep("whole", {}, {"cpus": 1}, tiny.segments)
    trained(store, tiny.segments)
    target = tiny.segments[0]
    removals: list[list[str]] = []

    def remove_slowly(keys) -> None:
        removals.append(list(keys))
        time.sleep(0.3)

    start = threading.Barrier(4)
    outcomes: list[str] = []

    def invalidate() -> None:
        start.wait()
        try:
            store.invalidate(target.id, "carol", before_commit=remove_slowly)
            outcomes.append("done")
        except ConflictError as e:
            outcomes.append("conflict" if "only a done segment" in str(e) else repr(e))
        except Exception as e:  # what the race raised before (IntegrityError): shown in the assertion
            outcomes.append(repr(e))

    threads = [threading.Thread(target=invalidate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["conflict", "conflict", "conflict", "done"], outcomes
    assert len(removals) == 1
    assert [a.status for a in store.attempts(target.id)].count("invalidated") == 1
