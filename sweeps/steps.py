"""A spec's token budgets in whole optimiser steps, per size: what the planner builds from.

Token counts are trained in whole optimiser steps of `batch_size * context` tokens, so `resolve` turns every budget
into steps: to the nearest step (half up) by default, recorded in `notes`, or refused with `train.round_tokens: exact`.
The LR decay of a budget of S steps starts at step S - max(1, round(decay.fraction * S)). The spec's check
(sweeps/spec.py) reports `resolve`'s problems with its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from upscale.sweeps.errors import SpecProblem
from upscale.sweeps.model_dirs import DenseModelDir
from upscale.sweeps.segments import Shape

if TYPE_CHECKING:
    from upscale.sweeps.spec import LrSection, SweepSpec


@dataclass(frozen=True)
class Budgets:
    """Budgets of one kind for one size, in steps, with where the decay of each starts."""

    steps: tuple[int, ...]
    decay_start_steps: tuple[int, ...]


@dataclass(frozen=True)
class SizeRecipe:
    """Everything the planner needs for one dense size, in whole steps."""

    label: str
    shape: Shape
    tokens_per_step: int
    warmup_steps: int
    lr: LrSection | None
    init_std: float
    d1: Budgets | None  # None for an imported model, whose D1 is its trained_tokens
    d2: Budgets
    scratch: Budgets | None
    imported: DenseModelDir | None = None


@dataclass(frozen=True)
class Resolution:
    recipes: tuple[SizeRecipe, ...]
    problems: tuple[SpecProblem, ...]
    notes: tuple[str, ...]


def round_steps(tokens: float, tokens_per_step: int) -> int:
    """Whole steps nearest to `tokens` (half up)."""
    return math.floor(tokens / tokens_per_step + 0.5)


def decay_start_step(steps: int, fraction: float) -> int:
    """Step where the decay of a budget of `steps` starts: the last round(fraction*steps) steps, at least one."""
    return steps - max(1, math.floor(fraction * steps + 0.5))


def resolve(spec: SweepSpec) -> Resolution:
    """Per-size recipes in whole steps, with the rounding notes and the problems (budgets the steps cannot reach)."""
    problems: list[SpecProblem] = []
    notes: list[str] = []
    recipes = []
    t = spec.train
    for label, shape in spec.model.shapes().items():
        o = spec.size_override(label)
        where = f"per_size.{label}." if label in spec.per_size else ""
        tps = (o.batch_size or t.batch_size) * t.context
        warmup_tokens = t.warmup_tokens if o.warmup_tokens is None else o.warmup_tokens
        warmup_path = f"{where}warmup_tokens" if o.warmup_tokens is not None else "train.warmup_tokens"
        warmup = _steps(warmup_tokens, tps, warmup_path, label, t.round_tokens, problems, notes, allow_zero=True)
        if t.eval_every_tokens is not None:
            _steps(t.eval_every_tokens, tps, "train.eval_every_tokens", label, t.round_tokens, problems, notes)
        budgets: dict[str, Budgets | None] = {}
        for kind in ("d1", "d2", "scratch"):
            given = getattr(o.tokens, kind, None) if o.tokens else None
            path = f"per_size.{label}.tokens.{kind}" if given is not None else f"tokens.{kind}"
            values = given if given is not None else getattr(spec.tokens, kind)
            if values is None:
                budgets[kind] = None
                continue
            steps = [_steps(v, tps, f"{path}[{i}]", label, t.round_tokens, problems, notes)
                     for i, v in enumerate(values)]
            starts = [decay_start_step(s, t.decay.fraction) for s in steps]
            for i, (s, start) in enumerate(zip(steps, starts, strict=True)):
                if i and s == steps[i - 1]:
                    problems.append((f"{path}[{i}]", f"{label}: rounds to {s} steps of {tps} tokens, as {path}[{i - 1}]"
                                     " does; space the budgets further apart"))
                if s and start < max(warmup, 1):
                    problems.append((f"{path}[{i}]", f"{label}: budget {values[i]:g} ({s} steps) decays from step "
                                     f"{start}, before warmup ends at step {warmup}; raise it to at least "
                                     f"{_min_budget(warmup, t.decay.fraction) * tps} tokens or shorten the warmup"))
            budgets[kind] = Budgets(tuple(steps), tuple(starts))
        if t.lr_search and round_steps(t.lr_search.tokens, tps) <= warmup:
            problems.append(("train.lr_search.tokens", f"{label}: {t.lr_search.tokens} tokens per trial do not reach "
                             f"past the warmup ({warmup} steps of {tps})"))
        recipes.append(SizeRecipe(label, shape, tps, warmup, o.lr or t.lr, o.init_std or spec.model.init_std,
                                  budgets["d1"], budgets["d2"], budgets["scratch"], spec.model.dense_model))
    return Resolution(tuple(recipes), tuple(problems), tuple(notes))


def _min_budget(warmup: int, fraction: float) -> int:
    s = max(warmup, 1) + 1
    while decay_start_step(s, fraction) < max(warmup, 1):
        s += 1
    return s


def _steps(tokens: float, tps: int, path: str, label: str, mode: str, problems: list[SpecProblem], notes: list[str],
           allow_zero: bool = False) -> int:
    steps = round_steps(tokens, tps)
    if steps * tps != tokens:
        if mode == "exact":
            lo, hi = math.floor(tokens / tps) * tps, math.ceil(tokens / tps) * tps
            problems.append((path, f"{label}: {tokens:g} tokens is not a whole number of steps of {tps} "
                             f"(batch_size*context); use {lo} or {hi}, or set train.round_tokens: nearest"))
        elif steps or allow_zero:
            notes.append(f"{path} ({label}): {tokens:g} -> {steps * tps} tokens ({steps} steps of {tps})")
    if steps == 0 and not allow_zero:
        problems.append((path, f"{label}: {tokens:g} tokens is less than one step of {tps} tokens"))
    return steps
