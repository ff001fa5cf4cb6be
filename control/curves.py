"""Validation curves per trunk: what the loss-curve law (fitting/curve_law.py, docs/laws.md "Loss-curve laws") reads
beside the decays' end losses.

A trunk is the chain of trunk pieces of one model (the planner's trunk id, `SegmentRecord.trunk`: its first piece's
key): a dense size, one upcycled MoE (N1, D1, n_expert, topk, method, r) or one from-scratch MoE. Its curve is its
done pieces' validation points (`SegmentResult.curve`) on one token axis, each join's repeated point once; its
decay branches are the done decays that hang from it, each with its own points, its end loss, the observation it
produced and its LR schedule from step 1 (the trunk's steps, then its decay). `interior` lists the decays a sweep
plans on the trunk's trained part that have no observation yet, and `between` decays nobody plans, at the middle of
each two neighbouring budgets on the trained part: the points whose end loss the law can predict, so that a finished
sweep's curves still tell the fits something between the grid's points.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from upscale.control.fits import ObservationCache
from upscale.control.services import Services
from upscale.fitting.curve_law import Curve
from upscale.fitting.curve_observations import Interior
from upscale.fitting.curve_observations import TrunkCurves as FittedTrunk
from upscale.fitting.groups import GROUP_COLUMNS, group_label
from upscale.orchestrator.lr_search import resolve_lr
from upscale.orchestrator.observations import as_row
from upscale.orchestrator.records import ObservationRecord, SegmentRecord
from upscale.sweeps.segments import DECAY_KINDS, TRUNK_KINDS, SegmentSpec
from upscale.workers.schedule import lr_multiplier

OBSERVATION_FIELDS = ("kind", "N1", "D1", "D2", "D", "N2", "N_total", "n_expert", "topk", "parent_experts", "method",
                      "r", "loss")


@dataclass(frozen=True)
class Decay:
    """A decay branch of a trunk: done (its points and end loss) or planned and not yet observed (no points, loss
    None). ``lr_multipliers[i]`` is the factor of the peak LR of optimiser step i + 1, from the trunk's first step
    to the decay's last."""

    segment_key: str
    branch_tokens: int  # where it leaves the trunk: its decay start
    end_tokens: int
    lr_multipliers: tuple[float, ...]
    curve: tuple[tuple[int, float], ...]  # (tokens, validation loss), ascending
    loss: float | None
    observation: dict[str, Any]  # OBSERVATION_FIELDS and segment_key, as recorded (done) or as planned (no loss)


@dataclass(frozen=True)
class TrunkCurves:
    """One trunk's constant-LR curve, its schedule up to its last measured step, and its decays."""

    trunk: str
    kind: str  # dense_trunk, moe_trunk or scratch_trunk
    axes: dict[str, Any]  # the first piece's grid coordinates (size, N1, n_expert, topk, method, r, D1)
    tokens_per_step: int
    peak_lr: float
    curve: tuple[tuple[int, float], ...]
    lr_multipliers: tuple[float, ...]  # steps 1 .. the last measured one, warmup included
    decays: tuple[Decay, ...]  # done, by end tokens
    interior: tuple[Decay, ...]  # planned, not observed, branching at or before the last measured token
    # not planned: at the geometric middle of each two neighbouring budgets of the trunk, branching on its trained
    # part and scheduled as its planned decays are (`_between`): what the curve tells between the grid's points
    between: tuple[Decay, ...] = ()


def sweep_curves(services: Services, sweep_ids: Sequence[str],
                 cache: ObservationCache | None = None) -> list[TrunkCurves]:
    """Every trunk of the sweeps with at least two measured points, in plan order, with its done decays and its
    interior points (the sweeps' planned decays on it without an observation). ``cache``: a refit tick's
    observation reads, shared with the tables it hashes."""
    segs: dict[str, SegmentRecord] = {}
    axes: dict[str, dict[str, Any]] = {}
    observed: dict[str, dict[str, Any]] = {}
    for sweep_id in sweep_ids:
        for seg, link in services.store.members(sweep_id):
            segs.setdefault(seg.key, seg)
            axes.setdefault(seg.key, link.axes)
        for o in cache.records(sweep_id) if cache is not None else services.store.observations(sweep_id):
            observed[o.segment_key] = {f: getattr(o, f) for f in OBSERVATION_FIELDS} | {"segment_key": o.segment_key}
    pieces: dict[str, list[SegmentRecord]] = {}
    decays: dict[str, list[SegmentRecord]] = {}
    for seg in segs.values():
        if seg.kind in TRUNK_KINDS:
            pieces.setdefault(seg.trunk or seg.key, []).append(seg)
        elif seg.kind in DECAY_KINDS:
            decays.setdefault(seg.trunk or seg.key, []).append(seg)
    out = []
    for trunk, chain in pieces.items():
        found = _trunk(trunk, chain, decays.get(trunk, []), segs, axes, observed)
        if found is not None:
            out.append(found)
    return out


def _trunk(trunk: str, chain: list[SegmentRecord], branches: list[SegmentRecord], segs: dict[str, SegmentRecord],
           axes: dict[str, dict[str, Any]], observed: dict[str, dict[str, Any]]) -> TrunkCurves | None:
    """One trunk from its pieces: the done ones from its start on, as long as each begins where the last ended."""
    chain = sorted(chain, key=lambda s: s.config["start_tokens"])
    done, reached = [], 0
    for piece in chain:
        if piece.status != "done" or piece.config["start_tokens"] != reached:
            break
        done.append(piece)
        reached = piece.config["end_tokens"]
    points: dict[int, float] = {}
    for piece in done:
        for tokens, loss in _points(piece):
            points.setdefault(tokens, loss)  # a join's point once: the earlier piece's end, the later one's start
    if len(points) < 2:
        return None
    first = resolve_lr(SegmentSpec.model_validate(done[0].config), segs)
    assert first.optim is not None and first.optim.lr is not None and first.schedule is not None  # a trained trunk
    tps, sched = first.tokens_per_step, first.schedule
    last = max(points)
    done_decays, interior = [], []
    by_end = sorted(branches, key=lambda s: s.config["end_tokens"])
    ordered = [(seg, SegmentSpec.model_validate(seg.config)) for seg in by_end]
    def schedule(spec: SegmentSpec) -> tuple[float, ...]:
        """A kept decay's LR multiplier of every step from 1 to its end (built only for the decays kept: a refit
        tick reads the curves of every schedule's sweeps)."""
        assert spec.decay_start_tokens is not None  # every decay kind has one
        return tuple(lr_multiplier(s * tps, sched, spec.decay_start_tokens, spec.end_tokens)
                     for s in range(1, spec.end_tokens // tps + 1))

    for seg, spec in ordered:
        if seg.status == "done":
            if seg.key in observed:
                done_decays.append(Decay(seg.key, spec.start_tokens, spec.end_tokens, schedule(spec),
                                         tuple(_points(seg)), observed[seg.key]["loss"], observed[seg.key]))
        elif seg.observation is not None and spec.start_tokens <= last:
            planned = {f: seg.observation.get(f) for f in OBSERVATION_FIELDS if f != "loss"} | {"segment_key": seg.key}
            interior.append(Decay(seg.key, spec.start_tokens, spec.end_tokens, schedule(spec), (), None, planned))
    return TrunkCurves(
        trunk=trunk, kind=done[0].kind, axes=axes.get(done[0].key, {}), tokens_per_step=tps, peak_lr=first.optim.lr,
        curve=tuple(sorted(points.items())),
        lr_multipliers=tuple(lr_multiplier(s * tps, sched, None, last) for s in range(1, last // tps + 1)),
        decays=tuple(done_decays), interior=tuple(interior), between=_between(ordered, tps, last))


# what a decay's budget sets
BUDGET_COLUMN = {"dense": ("D", "D1"), "scratch": ("D",), "upcycled": ("D2",), "expanded": ("D2",)}


def _between(branches: list[tuple[SegmentRecord, SegmentSpec]], tps: int, last: int) -> tuple[Decay, ...]:
    """Decays nobody planned, one at the geometric middle of each two neighbouring budgets of a trunk's decays
    (``branches``, by end), where it branches on the trained part (up to ``last`` tokens) after the warmup: cut as
    the planner cuts a budget (its decay the same share of it, to whole steps) and scheduled as the neighbour below
    it is."""
    planned = [(seg, spec) for seg, spec in branches if seg.observation is not None]
    out = []
    for (below, spec), (above, _) in itertools.pairwise(planned):
        lo, hi = below.config["end_tokens"] // tps, above.config["end_tokens"] // tps
        middle = round(math.sqrt(lo * hi))
        assert spec.decay_start_tokens is not None and spec.schedule is not None  # a decay
        share = (lo - spec.decay_start_tokens // tps) / lo
        start = (middle - max(1, round(share * middle))) * tps
        if not lo < middle < hi or start > last or start < spec.schedule.warmup_tokens:
            continue
        end = middle * tps
        schedule = tuple(lr_multiplier(s * tps, spec.schedule, start, end) for s in range(1, middle + 1))
        observation = {**{f: below.observation.get(f) for f in OBSERVATION_FIELDS if f != "loss"},
                       **dict.fromkeys(BUDGET_COLUMN[below.observation["kind"]], end), "segment_key": None}
        out.append(Decay("", start, end, schedule, (), None, observation))
    return tuple(out)


def _points(seg: SegmentRecord) -> list[tuple[int, float]]:
    """A done segment's validation points; a result recorded before segments kept their curve gives its start (if
    measured) and end losses."""
    result = seg.result or {}
    if result.get("curve"):
        return [(int(t), float(v)) for t, v in result["curve"]]
    start = (result.get("metrics") or {}).get("val_loss_start")
    ends = [(seg.config["start_tokens"], start), (seg.config["end_tokens"], result.get("val_loss"))]
    return [(t, float(v)) for t, v in ends if v is not None]


TABLES = {"dense_trunk": "dense", "scratch_trunk": "scratch", "moe_trunk": "upcycled"}


def fitting_trunks(trunks: Sequence[TrunkCurves]) -> list[FittedTrunk]:
    """The trunks as the curve predictions read them (fitting/curve_observations.py): LRs as multipliers of each
    trunk's own peak, so one family's decay parameters share a unit; the table and family their decays belong to
    (dense, from scratch, or one upcycled group: a family's decays behave alike); its interior decays and those
    between its budgets as rows of that table, as orchestrator/observations.py writes an observation's."""
    out = []
    for t in trunks:
        observations = [d.observation for d in (*t.decays, *t.interior)]
        # expansion studies read observed decays only (fitting/expansion.py)
        if t.kind not in TABLES or any(o.get("kind") == "expanded" for o in observations):
            continue
        table = TABLES[t.kind]
        decays = tuple(Curve(np.asarray(d.lr_multipliers), *_steps_and_losses(t, d.curve)) for d in t.decays)
        family = table if table != "upcycled" or not observations else \
            f"upcycled {group_label({c: observations[0].get(c) for c in GROUP_COLUMNS})}".strip()
        interior = tuple(Interior(_fitted_row(ObservationRecord(**{f: d.observation.get(f) for f in OBSERVATION_FIELDS},
                                                                 trunk=t.trunk, segment_key=d.segment_key or None)),
                                  np.asarray(d.lr_multipliers)) for d in (*t.interior, *t.between))
        out.append(FittedTrunk(t.trunk, Curve(np.asarray(t.lr_multipliers), *_steps_and_losses(t, t.curve)), decays,
                               table, family, interior))
    return out


def _fitted_row(o: ObservationRecord) -> dict[str, object]:
    """`as_row` without parent_experts, which only expanded rows set and no fitted trunk holds: the rows, and so the
    curves' hash an analysis's inputs hash stands on, are what they were before the column."""
    row = as_row(o)
    del row["parent_experts"]
    return row


def _steps_and_losses(t: TrunkCurves, points: Sequence[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray]:
    kept = [(tokens // t.tokens_per_step, v) for tokens, v in points if tokens > 0]
    return np.array([s for s, _ in kept]), np.array([v for _, v in kept])
