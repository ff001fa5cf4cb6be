"""The MLflow tags of upscale's runs: one set of names, built here for every writer.

A segment's run is created by the orchestrator (a child of its sweep's run) or, for a segment trained alone
(`upscale train-segment`), by the worker; either way it carries the same tags: `upscale.<field>` for what the
segment is (its id, kind, shape, budget, method...) and `axis.<name>` for its coordinates in the grid of the sweep
that planned it. A sweep's run carries `upscale.sweep_id`, `upscale.kind` = `sweep` and, once it ends,
`upscale.status`. The prefixes keep them apart from MLflow's own `mlflow.*` tags.
"""

from __future__ import annotations

from typing import Any

from upscale.sweeps.segments import SegmentSpec

PREFIX = "upscale."
AXIS_PREFIX = "axis."
KIND = PREFIX + "kind"
SEGMENT_ID = PREFIX + "segment_id"
SWEEP_ID = PREFIX + "sweep_id"
STATUS = PREFIX + "status"


def sweep_tags(sweep_id: str) -> dict[str, str]:
    return {SWEEP_ID: sweep_id, KIND: "sweep"}


def axis_tags(axes: dict[str, Any]) -> dict[str, str]:
    """A segment's grid axes (D1, D2, method, r, ...) as tags."""
    return {AXIS_PREFIX + k: str(v) for k, v in axes.items()}


def segment_tags(spec: SegmentSpec) -> dict[str, str]:
    """What a segment is, as tags: its id and kind, its parents, shape, data, budget, optimiser, schedule, method."""
    m = spec.model
    tags: dict[str, Any] = {
        "segment_id": spec.id, "kind": spec.kind, "parent_ids": ",".join(spec.parent_ids), "n_layer": m.n_layer,
        "d_model": m.d_model, "n_head": m.n_head, "n_expert": m.n_expert, "topk": m.topk, "context": m.context,
        "seed": spec.seed, "start_tokens": spec.start_tokens, "end_tokens": spec.end_tokens,
        "corpus": spec.data.corpus, "tokenizer": spec.data.tokenizer}
    if spec.optim is not None:
        tags |= {"lr": spec.optim.lr, "batch_size": spec.optim.batch_size}
    if spec.schedule is not None:
        tags |= {"schedule": spec.schedule.kind, "decay_shape": spec.schedule.decay_shape,
                 "decay_start_tokens": spec.decay_start_tokens}
    if spec.upcycle is not None:
        tags |= {"method": spec.upcycle.method, "r": spec.upcycle.r, "upcycle_seed": spec.upcycle.seed}
    return {PREFIX + k: str(v) for k, v in tags.items()}
