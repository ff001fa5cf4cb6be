"""Checkpoint garbage collection on a sweep trained by the scheduler: what a pending branch needs stays, finished
leaves go, likely branch points stay unless everything is asked for.

Strategy: train the tiny sweep with the counting segment function (real files on disk), add a pending segment that
branches from one MoE decay's parent trunk, and check file by file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.orchestrator.conftest import TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment
from upscale.orchestrator.gc import collect_garbage
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.sweeps.loader import load_spec

pytestmark = pytest.mark.usefixtures("ray_session")


def test_gc_keeps_what_pending_and_likely_branches_need(settings) -> None:
    orch = Orchestrator.open(settings)
    orch.run(load_spec(TINY_SPEC), Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05))
    # a bigger grid, not run yet: its new upcycles (noise) are pending and start from the trained dense_decays
    bigger = orch.submit(load_spec(TINY_SPEC.replace("methods: [naive, drop]", "methods: [naive, drop, noise]")))
    kinds = {seg.key: seg.kind for seg, _ in orch.store.members(bigger.id)}
    done = {seg.key for seg, _ in orch.store.members(bigger.id) if seg.status == "done"}
    needed = {p for seg, _ in orch.store.members(bigger.id) if seg.status == "pending" for p in seg.parents} & done
    assert {kinds[p] for p in needed} == {"dense_decay"} and len(needed) == 2

    def owners(uris: list[str]) -> list[str]:
        return sorted(kinds[Path(u).parts[-2]] for u in uris)

    dry = collect_garbage(orch.store, dry_run=True)
    assert owners(dry.deleted) == ["moe_decay"] * 8 + ["scratch_decay"]  # finished leaves only
    assert all(Path(u).exists() for u in dry.deleted) and dry.freed_bytes > 0
    report = collect_garbage(orch.store)
    assert sorted(report.deleted) == sorted(dry.deleted)
    assert not any(Path(u).exists() for u in report.deleted) and all(Path(u).exists() for u in report.kept)
    assert collect_garbage(orch.store).deleted == []  # nothing left to do

    everything = collect_garbage(orch.store, everything=True)
    assert {Path(u).parts[-2] for u in everything.kept} == needed  # only what a pending segment starts from
    # trunk pieces (one per branch point: 2 dense, 4 MoE chains x 2, 1 scratch) and upcycles: their final checkpoint
    assert owners(everything.deleted) == sorted(["dense_trunk"] * 2 + ["moe_trunk"] * 8 + ["scratch_trunk"] * 1
                                                + ["upcycle"] * 4)
