"""Which laws a grid of observations can identify, and why not: what `upscale plan` warns about before anything
trains (on the planned grid, control/identifiability.py) and what the analysis reports on the measured one.

A law is identifiable on a grid when no change of its parameters leaves the predicted loss unchanged at every planned
point, i.e. when the Jacobian of the prediction with respect to the fitted parameters (log scales, exponents) has full
column rank. That is checked numerically, at generic parameter values that put every term at the same size on the
grid, so the answer depends only on the grid's coordinates and the law's declaration in `fitting.laws` (its terms and
columns), never on a hand-written rule per law. A parameter is unidentified when it has a component in the Jacobian's
null space; the reason names the grid axes those parameters read, and the suggestion is the fewest extra values of one
axis (or of all of them) that make the Jacobian full rank, found by re-running the same check on the grown grid.

The laws checked are the ones the analysis fits (docs/laws.md): Chinchilla on the dense and the from-scratch MoE
observations with E shared between them, the joint law and the data law on each upcycled group (method, r, E x k),
the data law per dense size, and D*, which needs both the from-scratch MoE law and the joint law. The joint law is
checked with E fixed, as the analysis fits it (E comes from the dense and from-scratch laws).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import product

import numpy as np

from upscale.fitting.laws import LAWS, Law

Row = tuple[float, ...]
# Singular values below this fraction of the largest (columns normalised) count as zero: the grids' log-coordinates
# make genuine directions at least ~1e-5 strong, rounding noise is ~1e-15.
_RANK_TOL = 1e-9
_MAX_EXTRA = 3  # the most extra values of an axis a suggestion tries
# Generic exponents (distinct, so no two exponent columns coincide by accident) and the interaction's.
_EXPONENTS = (0.31, 0.23, 0.37, 0.27, 0.41, 0.19)  # cycled if a law had more
_INTERACTION = 0.013


@dataclass(frozen=True)
class Grid:
    """Observation coordinates (planned or measured) as the laws read them: dense (N, D) and from-scratch (N, D)
    rows, with N the dense size N1, and upcycled (N1, D1, D2) rows per group (method, r, n_expert x topk)."""

    dense: tuple[Row, ...]
    scratch: tuple[Row, ...]
    upcycled: Mapping[str, tuple[Row, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class LawCheck:
    """One law of the analysis on this grid: identifiable or not, why, and what to add to the spec."""

    law: str  # a name of the registry, or "D*"
    fit: str  # the observations it is fitted on, e.g. "dense (E shared with scratch)", "upcycled naive 8x2"
    identifiable: bool
    reason: str
    add: str = ""  # what to add to the spec; "" when identifiable
    unidentified: tuple[str, ...] = ()  # parameters the grid leaves free
    groups: tuple[str, ...] = ()  # the upcycled groups an upcycled entry is of

    def as_dict(self) -> dict[str, object]:
        return {"law": self.law, "fit": self.fit, "identifiable": self.identifiable, "reason": self.reason,
                "add": self.add, "unidentified": list(self.unidentified)}


# -- the check -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Block:
    """One table of a (possibly shared) fit: a law, its rows (values of ``columns``) and a parameter prefix."""

    law: Law
    columns: tuple[str, ...]
    rows: tuple[Row, ...]
    label: str
    fixed: frozenset[str] = frozenset()  # parameters the fit holds fixed: not columns of the Jacobian

    @property
    def free(self) -> list[str]:
        return [p for p in self.law.param_names if p not in self.fixed]

    def table(self) -> dict[str, np.ndarray]:
        return {c: np.array([r[i] for r in self.rows], dtype=float) for i, c in enumerate(self.columns)}

    def with_rows(self, rows: tuple[Row, ...]) -> _Block:
        return _Block(self.law, self.columns, rows, self.label, self.fixed)

    def name(self, param: str, shared: frozenset[str]) -> str:
        return param if param in shared else f"{self.label}.{param}"


def _theta(law: Law, table: Mapping[str, np.ndarray]) -> np.ndarray:
    """Generic parameters (fitted coordinates) that make every term 1 at the grid's centre in log space."""
    centre = {c: float(np.mean(law.log_column(c, table[c]))) if len(table[c]) else 0.0  # a block without rows
              for c in law.columns}
    interactions = {m.param for t in law.terms for m in t.monomials if len(m.columns) > 1}
    main = iter(_EXPONENTS * len(law.params))
    exponents = {p.name: _INTERACTION if p.name in interactions else next(main)
                 for p in law.params if p.kind == "exponent"}
    theta = dict(exponents)
    for term in law.terms:
        theta[term.scale] = -sum(m.sign * exponents[m.param] * math.prod(centre[c] for c in m.columns)
                                 for m in term.monomials)
    return np.array([theta[n] for n in law.param_names])


def _jacobian(block: _Block) -> np.ndarray:
    """d(predicted loss)/d(free parameters) at every row of the block, columns in the law's parameter order."""
    table = block.table()
    X = block.law.design(table)  # [term, row, param]
    terms = np.exp(X @ _theta(block.law, table))  # [term, row]
    keep = [i for i, p in enumerate(block.law.param_names) if p not in block.fixed]
    return np.einsum("tr,trj->rj", terms, X)[:, keep]


def _unidentified(blocks: Sequence[_Block], shared: frozenset[str]) -> tuple[str, ...]:
    """Parameters (prefixed by their block's label unless shared) with a component in the Jacobian's null space."""
    names: list[str] = []
    for b in blocks:
        names += [n for n in (b.name(p, shared) for p in b.free) if n not in names]
    J = np.zeros((sum(len(b.rows) for b in blocks), len(names)))
    start = 0
    for b in blocks:
        cols = [names.index(b.name(p, shared)) for p in b.free]
        J[start:start + len(b.rows), cols] = _jacobian(b)
        start += len(b.rows)
    norms = np.linalg.norm(J, axis=0)
    J = J / np.where(norms > 0, norms, 1.0)
    _, s, vt = np.linalg.svd(J, full_matrices=True)
    rank = int(np.sum(s > _RANK_TOL * s.max())) if s.size else 0
    null = vt[rank:]  # every direction beyond the rank (rows < parameters included)
    weight = np.sum(null ** 2, axis=0)
    return tuple(n for n, w in zip(names, weight, strict=True) if w > 1e-6)


def _grow(rows: Sequence[Row], column: int, extra: int) -> tuple[Row, ...]:
    """The rows with ``extra`` new values of one axis, each crossed with every other coordinate (as the planner
    crosses a new budget or size with the rest of the grid); new values continue the axis geometrically. A block
    without rows stays empty: its axis has no values to continue (a sweep of expert upcycling has no dense runs)."""
    if not rows:
        return tuple(rows)
    values = sorted({r[column] for r in rows})
    step = values[-1] / values[-2] if len(values) > 1 else 2.0
    new = [values[-1] * step ** (i + 1) for i in range(extra)]
    others = sorted({r[:column] + r[column + 1:] for r in rows})
    grown = {(*o[:column], v, *o[column:]) for o, v in product(others, new)}
    return tuple(sorted(set(rows) | grown))


@dataclass(frozen=True)
class _Axis:
    """A column of one block as the spec names it."""

    block: int
    column: int  # index in the block's rows
    label: str  # the law's column: "N", "D1", ...
    spec_field: str  # where the user adds values, e.g. "model.sizes"
    noun: str  # "dense size", "D1 budget"


def _suggest(blocks: list[_Block], shared: frozenset[str], axes: Sequence[_Axis], wanted: set[str]) -> str:
    """The fewest extra values of one axis (else of every axis at once) after which none of ``wanted`` is left
    unidentified; "" if even that does not help."""

    def fixed(grown: list[_Block]) -> bool:
        return not wanted & set(_unidentified(grown, shared))

    for extra in range(1, _MAX_EXTRA + 1):
        for a in axes:
            grown = list(blocks)
            grown[a.block] = blocks[a.block].with_rows(_grow(blocks[a.block].rows, a.column, extra))
            if fixed(grown):
                return f"{extra} more {a.noun}{'s' * (extra > 1)} ({a.spec_field})"
    for extra in range(1, _MAX_EXTRA + 1):
        grown = list(blocks)
        for a in axes:
            grown[a.block] = grown[a.block].with_rows(_grow(grown[a.block].rows, a.column, extra))
        if fixed(grown):
            return " and ".join(f"{extra} more {a.noun}{'s' * (extra > 1)} ({a.spec_field})" for a in axes)
    return ""


def _reason(blocks: Sequence[_Block], shared: frozenset[str], axes: Sequence[_Axis], missing: Sequence[str]) -> str:
    """Why: the axes with too few values for the terms of the unidentified parameters, and the point count."""
    parts = []
    for a in axes:
        b = blocks[a.block]
        n = len({r[a.column] for r in b.rows})
        reads = {m.param for t in b.law.terms for m in t.monomials if a.label in m.columns}
        reads |= {t.scale for t in b.law.terms if a.label in t.columns}
        if n < 3 and {p.split(".")[-1] for p in missing} & reads:
            parts.append(f"{a.label} takes {n} value{'s' * (n != 1)}")
    n_params = len({b.name(p, shared) for b in blocks for p in b.free})
    points = sum(len(b.rows) for b in blocks)
    if points < n_params:
        parts.append(f"{_count(points, 'point')} for {n_params} parameters")
    what = ", ".join(parts) if parts else "the grid's points do not separate them"
    names = ", ".join(p.split(".")[-1] for p in missing)  # the entry's `fit` says which table
    return f"{what}: {names} cannot be told apart from the other parameters"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _check(name: str, fit: str, blocks: list[_Block], axes: list[_Axis], own: str | None = None,
           shared: frozenset[str] = frozenset()) -> LawCheck:
    """One entry: ``own`` restricts the verdict to the parameters of one block's label (and the shared ones)."""
    missing = [p for p in _unidentified(blocks, shared) if own is None or p in shared or p.startswith(f"{own}.")]
    points = sum(len(b.rows) for b in blocks)
    n_params = len({b.name(p, shared) for b in blocks for p in b.free})
    if not missing and points <= n_params:
        return LawCheck(name, fit, False, f"{_count(points, 'point')} for {n_params} parameters: the fit would pass "
                        "through every point, with nothing left to test it", "add one more budget or size")
    if not missing:
        return LawCheck(name, fit, True, f"{points} distinct points for {n_params} parameters identify every one")
    relevant = [a for a in axes if own is None or blocks[a.block].label == own]
    add = _suggest(blocks, shared, relevant, set(missing))
    return LawCheck(name, fit, False, _reason(blocks, shared, relevant, missing),
                    f"add {add}" if add else "add points along every axis", tuple(missing))


def identifiability(grid: Grid, laws: Mapping[str, Law] = LAWS) -> list[LawCheck]:
    """Per law the analysis fits: whether ``grid`` identifies it, the reason, and what to add to the spec.

    ``laws`` is the registry (`fitting.laws.LAWS`); the analysis uses its ``chinchilla``, ``joint`` and ``data-mul``.
    """
    chin, joint, data = laws["chinchilla"], laws["joint"], laws["data-mul"]
    e_shared = frozenset({"E"})
    out: list[LawCheck] = []
    dense_axes = [_Axis(0, 0, "N", "model.sizes", "dense size"), _Axis(0, 1, "D", "tokens.d1", "D1 budget")]
    if grid.scratch:
        blocks = [_Block(chin, ("N", "D"), grid.dense, "dense"), _Block(chin, ("N", "D"), grid.scratch, "scratch")]
        axes = [*dense_axes, _Axis(1, 0, "N", "model.sizes", "dense size"),
                _Axis(1, 1, "D", "tokens.scratch", "from-scratch budget")]
        out.append(_check(chin.name, "dense (E shared with scratch)", blocks, axes, own="dense", shared=e_shared))
        scratch = _check(chin.name, "from-scratch MoE (E shared with dense)", blocks, axes, own="scratch",
                         shared=e_shared)
        out.append(scratch)
    else:
        out.append(_check(chin.name, "dense", [_Block(chin, ("N", "D"), grid.dense, "dense")], dense_axes))
        scratch = LawCheck(chin.name, "from-scratch MoE", False, "no from-scratch budgets: no MoE law, so no D* and "
                           "no upcycle-or-scratch verdict", "add tokens.scratch (e.g. the D1 budgets)",
                           chin.param_names)
        out.append(scratch)
    groups: dict[tuple[Row, ...], list[str]] = {}  # groups planned on the same points get one entry
    for group, rows in grid.upcycled.items():
        groups.setdefault(rows, []).append(group)
    joints = []
    for rows, names in groups.items():
        group = ", ".join(names)
        axes = [_Axis(0, 0, "N1", "model.sizes", "dense size"), _Axis(0, 1, "D1", "tokens.d1", "D1 budget"),
                _Axis(0, 2, "D2", "tokens.d2", "D2 budget")]
        block = _Block(joint, ("N1", "D1", "D2"), rows, "upcycled", e_shared)
        joints.append(replace(_check(joint.name, f"upcycled {group}", [block], axes), groups=tuple(names)))
        out.append(joints[-1])
        slices = {}
        for n1 in sorted({r[0] for r in rows}):
            block = _Block(data, ("D1", "D2"), tuple((d1, d2) for n, d1, d2 in rows if n == n1), "upcycled")
            slices[n1] = _check(data.name, f"upcycled {group}, N1={n1:.3g}", [block],
                                [_Axis(0, 0, "D1", "tokens.d1", "D1 budget"),
                                 _Axis(0, 1, "D2", "tokens.d2", "D2 budget")])
        bad = [c for c in slices.values() if not c.identifiable]
        out.append(bad[0] if bad else LawCheck(data.name, f"upcycled {group}, at each dense size "
                                               f"({len(slices)})", True, next(iter(slices.values())).reason))
    ok_joint = [c for c in joints if c.identifiable]
    if scratch.identifiable and ok_joint:
        out.append(LawCheck("D*", f"{chin.name} (from-scratch MoE) and {joint.name}", True,
                            "both laws it compares are identifiable"))
    else:
        why = ([f"the from-scratch MoE law ({chin.name})"] if not scratch.identifiable else []) + \
            ([] if ok_joint else [f"the upcycled law ({joint.name})"])
        out.append(LawCheck("D*", f"{chin.name} (from-scratch MoE) and {joint.name}", False,
                            f"needs {' and '.join(why)}, which the grid cannot identify", "see the laws above"))
    return out
