"""An observation's training path: the segments from a random init to its decay, each placed on one token axis.

A decay's loss is the end of one model's life: dense trunk pieces then the dense decay, or those, the upcycle, the
MoE trunk pieces and the MoE decay. Each segment counts tokens on its own schedule (an MoE's count restarts at 0
after the upcycle), so a segment's `offset` is the tokens the model saw before its schedule began: a child whose
schedule starts before its parent's end (the upcycle) adds the parent's end to the offset, every other child keeps
it. Step + offset is then "tokens seen since the random init" along the whole path. LR searches only fix an LR:
they are no part of a path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from upscale.orchestrator.records import SegmentRecord


@dataclass(frozen=True)
class PathStep:
    """One segment of a path: its run (None when MLflow had none), kind, span on its own schedule and offset."""

    run_id: str | None
    kind: str
    start_tokens: int
    end_tokens: int
    offset: int


def training_path(key: str, segment: Callable[[str], SegmentRecord]) -> list[PathStep]:
    """The path that ends with segment ``key``, from its first segment (``segment`` reads a record by key)."""
    chain = [segment(key)]
    while parents := [p for p in chain[-1].parents if segment(p).kind != "lr_search"]:
        chain.append(segment(parents[0]))  # every trained segment has one model parent
    steps: list[PathStep] = []
    for seg in reversed(chain):
        start, end = seg.config["start_tokens"], seg.config["end_tokens"]
        offset = 0
        if steps:
            before = steps[-1]
            offset = before.offset + (before.end_tokens if start < before.end_tokens else 0)
        steps.append(PathStep(seg.mlflow_run_id, seg.kind, start, end, offset))
    return steps
