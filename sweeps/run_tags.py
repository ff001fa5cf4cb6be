"""What upscale's MLflow runs say about themselves: names, params and tags, built here for every writer.

A segment's run is created by the orchestrator (a child of its sweep's run) or, for a segment trained alone
(`upscale train-segment`), by the worker; either way it gets the same three things from this module:

* a **name** a person can read, what sets it apart first: e.g. `upcycled naive 4x2 · nano N1 1.2M · D1 64k · D2 128k ·
  decay`, a trunk piece with its token span (`dense · nano N1 1.2M · trunk 0–64k tok`);
* **params**, MLflow's place for configuration: what the segment is (kind, size, N1, D1, D2, method, r, n_expert,
  topk, lr, batch size, context, seed, parents, shape, schedule, data), so the UI's Parameters table and
  `params.method = 'naive'` searches work. MLflow params are immutable, so they are logged once, with the LR an LR
  search found already resolved;
* **tags** only for identity and state: `upscale.segment_id` (the segment's content key, the id the store and the
  observations know), `upscale.sweep_id`, `upscale.role` (sweep, segment, or reused: a child that links the run
  which trained a segment an earlier sweep shared) and `upscale.status`.

The `upscale.` prefix keeps the tags apart from MLflow's own `mlflow.*` ones.
"""

from __future__ import annotations

from typing import Any

from upscale.sweeps.segments import TRUNK_KINDS, SegmentSpec
from upscale.sweeps.spec import R_METHODS

PREFIX = "upscale."
SEGMENT_ID = PREFIX + "segment_id"
SWEEP_ID = PREFIX + "sweep_id"
ROLE = PREFIX + "role"
STATUS = PREFIX + "status"
REUSE_STALE = PREFIX + "reuse_stale"  # on a sweep's run: how many segments it took over from an older training version
TRAINED_IN_RUN = PREFIX + "trained_in_run"  # on a reused segment's child: the run that trained it

# The grid axes a segment's params take from the sweep's plan (sweeps/planner.py); `sweep` (the sweep's name) is not
# one of them: a segment shared by two sweeps is the same segment, and its run's params may not differ.
PLAN_AXES = ("size", "N1", "D1", "D2", "D", "family", "parent_experts")


def compact(x: float) -> str:
    """A token or parameter count in two significant digits: 512, 6.4e4, 1.3e5, 1e9."""
    if abs(x) < 1000:
        return f"{x:g}"
    mantissa, exponent = f"{x:.2g}".split("e")
    return f"{mantissa}e{int(exponent)}"


FAMILY = {"dense_trunk": "dense", "dense_decay": "dense", "dense_import": "dense", "upcycle": "upcycled",
          "expand": "expanded", "moe_trunk": "upcycled", "moe_decay": "upcycled", "scratch_trunk": "scratch",
          "scratch_decay": "scratch", "lr_search": "lr search"}  # an MoE trunk or decay after an expand: expanded
# else the kind's suffix: trunk, decay
PHASE = {"dense_import": "imported", "upcycle": "upcycle", "expand": "expand", "lr_search": ""}


def si(x: float) -> str:
    """A token or parameter count as people write it: 512, 64k, 1.25M, 40M, 3B."""
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:g}"


def run_name(spec: SegmentSpec, axes: dict[str, Any] | None = None) -> str:
    """What sets the run apart first, so the runs table never cuts it off: the family, method and experts, the size
    and N1, the budgets, then the phase, a trunk piece with its token span. E.g.
    `upcycled drop r=0.5 4x1 · nano N1 1.2M · D1 512 · D2 256 · decay`, `dense · nano N1 1.2M · trunk 0–448 tok`.
    A segment trained alone has no plan: its shape stands in for the size, its span for the budgets."""
    axes = axes or {}
    m = spec.model
    built = spec.upcycle or spec.expand  # what an upcycle or expand builds the MoE with
    method = built.method if built is not None else axes.get("method")
    head = ["expanded" if axes.get("parent_experts") else FAMILY[spec.kind]]
    if axes.get("family"):
        head.append(str(axes["family"]))
    if method:
        r = spec.upcycle.r if spec.upcycle is not None and method in R_METHODS else axes.get("r")
        head.append(f"{method} r={r:g}" if r is not None else method)
    if m.n_expert:
        head.append(f"{m.n_expert}x{m.topk}")
    size = str(axes.get("size") or f"L{m.n_layer}-d{m.d_model}")
    parts = [" ".join(head), f"{size} N1 {si(axes['N1'])}" if axes.get("N1") else size]
    parts += [f"{k} {si(axes[k])}" for k in ("D1", "D2") if axes.get(k) is not None]
    if not any(axes.get(k) is not None for k in ("D1", "D2")) and axes.get("D") is not None:
        parts.append(f"D {si(axes['D'])}")
    phase = PHASE.get(spec.kind, spec.kind.rsplit("_", 1)[-1])
    if spec.kind in TRUNK_KINDS or (phase == "decay" and len(parts) == 2):
        phase += f" {si(spec.start_tokens)}–{si(spec.end_tokens)} tok"
    return " · ".join([*parts, phase] if phase else parts)


def segment_params(spec: SegmentSpec, axes: dict[str, Any] | None = None) -> dict[str, str]:
    """Configuration and grid axes as MLflow params (strings; unset values left out)."""
    m = spec.model
    values: dict[str, Any] = {
        "kind": spec.kind, **{k: (axes or {}).get(k) for k in PLAN_AXES},
        "n_expert": m.n_expert, "topk": m.topk, "context": m.context, "seed": spec.seed,
        "parents": ",".join(spec.parent_ids) or None, "n_layer": m.n_layer, "d_model": m.d_model,
        "n_head": m.n_head, "vocab_size": m.vocab_size, "start_tokens": spec.start_tokens,
        "end_tokens": spec.end_tokens, "corpus": spec.data.corpus, "tokenizer": spec.data.tokenizer,
        "data_seed": spec.data.data_seed}
    if spec.optim is not None:
        values |= {"lr": spec.optim.lr, "batch_size": spec.optim.batch_size}
    if spec.schedule is not None:
        values |= {"schedule": spec.schedule.kind, "decay_shape": spec.schedule.decay_shape,
                   "warmup_tokens": spec.schedule.warmup_tokens, "decay_start_tokens": spec.decay_start_tokens}
    if spec.upcycle is not None:
        r = spec.upcycle.r if spec.upcycle.method in R_METHODS else None
        values |= {"method": spec.upcycle.method, "r": r, "upcycle_seed": spec.upcycle.seed}
    elif spec.expand is not None:
        values |= {"method": spec.expand.method, "r": spec.expand.r or None, "expand_factor": spec.expand.factor,
                   "expand_seed": spec.expand.seed}
    elif axes and axes.get("method"):  # an MoE trunk or decay descends from an upcycle (an expand): an axis
        values |= {"method": axes["method"], "r": axes.get("r")}
    if spec.lr_search is not None:
        values |= {"lr_trials": spec.lr_search.trials, "lr_low": spec.lr_search.low, "lr_high": spec.lr_search.high}
    return {k: str(v) for k, v in values.items() if v is not None}


def segment_tags(segment_id: str, sweep_id: str | None = None, role: str = "segment") -> dict[str, str]:
    """A segment run's identity: its content key, the sweep that trained it, and its role."""
    tags = {SEGMENT_ID: segment_id, ROLE: role}
    if sweep_id is not None:
        tags[SWEEP_ID] = sweep_id
    return tags


def sweep_tags(sweep_id: str) -> dict[str, str]:
    return {SWEEP_ID: sweep_id, ROLE: "sweep"}


def sweep_run_name(name: str, sweep_id: str) -> str:
    """The sweep's parent run: its name, and the start of its id (two sweeps may share a name)."""
    return f"{name} ({sweep_id[:8]})"


def sweep_params(spec: dict[str, Any]) -> dict[str, str]:
    """A sweep spec flattened to dotted keys (`model.sizes`, `tokens.d1`), as the parent run's params."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif value is not None:
            out[prefix] = str(value)[:6000]  # MLflow's limit on a param's value

    walk("", spec)
    return out
