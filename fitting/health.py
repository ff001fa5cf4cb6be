"""Fit health: is a converged fit one to believe? Four checks, each a named problem for the analysis record.

A fit can converge and still be degenerate: E driven to 0 (or above the losses it must explain), an exponent at the
edge of its plausible box, bootstrap intervals spanning many decades (the data do not determine the parameter), a
law whose predicted loss rises with tokens (the joint law's effective D2 exponent α2 − α3·log D1 turns negative),
or a leave-one-out error far above the noise. Each check below returns problems shaped as the analysis's others,
``{"law", "fit", "why", "add", "kind"}`` with kind "bound", "interval", "monotone" or "loo"; ``check_fit`` runs all
four on one fit, ``check_dstar`` the monotonicity at the D* the analysis reports, and ``concerning`` says which
problems a D* or a verdict rests on. docs/laws.md, "Fit health" gives the thresholds and why.

Pure numerics; nothing here refits or changes a fitted number.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from upscale.fitting.laws import LOSS, Law, Table

Problem = dict[str, Any]  # {"law", "fit", "why", "add", "kind"} (+ "n1" for a problem at one D*)
HEALTH_KINDS = ("bound", "interval", "monotone", "loo")


@dataclass(frozen=True)
class Thresholds:
    """When a fit is unhealthy (defaults in docs/laws.md, "Fit health")."""

    bound_share: float = 1e-3  # a parameter within this share of its plausible box of an edge is at the bound
    max_decades: float = 3.0  # a scale's (A, B, E, F) 95% interval spanning more decades is undetermined
    max_exponent_width: float = 0.5  # an exponent's 95% interval wider than this (or half its box) is undetermined
    loo_factor: float = 3.0  # LOO RMS above this many times the residual RMS: single points decide the fit
    grid: int = 9  # points per column of the trained range where monotonicity is checked


DEFAULT = Thresholds()


def problem(law: str, fit: str, kind: str, why: str, add: str, **extra: Any) -> Problem:
    return {"law": law, "fit": fit, "why": why, "add": add, "kind": kind, **extra}


def _columns_of(law: Law, name: str) -> tuple[str, ...]:
    """The columns a parameter acts on: an exponent's monomial columns, a scale's term columns (none for E)."""
    out: list[str] = []
    for term in law.terms:
        cols = ([c for m in term.monomials for c in m.columns] if term.scale == name else
                [c for m in term.monomials if m.param == name for c in m.columns])
        out += cols
    return tuple(dict.fromkeys(out))  # each column once, in order


def _more_of(law: Law, name: str) -> str:
    cols = _columns_of(law, name)
    if not cols:  # E: the floor is pinned by runs long enough for the loss to flatten
        return "longer runs (larger token budgets) at every size, where the loss approaches its floor, so the data " \
               "pin E"
    return f"more values of {', '.join(cols)}, over a wider range, so the data pin {name}"


def _position(law: Law, name: str, value: float) -> float:
    """Where ``value`` sits in the parameter's plausible box: 0 at the low edge, 1 at the high (log for scales)."""
    p = law.param(name)
    lo, hi = p.bounds
    if p.kind == "scale":
        if not value > 0:
            return -np.inf
        return float((np.log10(value) - np.log10(lo)) / (np.log10(hi) - np.log10(lo)))
    return float((value - lo) / (hi - lo))


def check_bounds(law: Law, params: Mapping[str, float], free: Iterable[str], *, where: tuple[str, str],
                 min_loss: float | None = None, th: Thresholds = DEFAULT) -> list[Problem]:
    """Free parameters at (within ``bound_share`` of) or outside an edge of their plausible box, and E at or above
    the smallest loss it must explain (``min_loss``; E fixed or free)."""
    out = []
    for name in free:
        value = float(params[name])
        lo, hi = law.param(name).bounds
        pos = _position(law, name, value)
        if th.bound_share <= pos <= 1 - th.bound_share:
            continue
        if lo <= value <= hi:
            why = f"{name}={value:.4g} is at the edge of its plausible range [{lo:g}, {hi:g}]"
        else:  # the text of fit.py's warning, so that a fit's warning and its problem read the same
            why = f"{name}={value:.4g} is outside its plausible range [{lo:g}, {hi:g}]"
        if name == "E" and pos - th.bound_share < 0:
            why += ": the irreducible loss driven to 0, which natural text does not have; the grid does not pin it"
        else:
            why += ": the fit ran to a limit rather than settling where the data put it"
        out.append(problem(*where, "bound", why, _more_of(law, name)))
    if min_loss is not None and "E" in params and float(params["E"]) >= min_loss:
        out.append(problem(*where, "bound", f"E={float(params['E']):.4g} is at or above the smallest observed loss "
                           f"{min_loss:.4g}: the law cannot reach the losses it was fitted to", _more_of(law, "E")))
    return out


def check_intervals(law: Law, ci: Mapping[str, Sequence[float | None]], *, where: tuple[str, str],
                    th: Thresholds = DEFAULT) -> list[Problem]:
    """Bootstrap intervals the data do not determine: a scale's spanning more than ``max_decades`` decades (or not
    positive), an exponent's wider than ``max_exponent_width`` or half its plausible box, or an open end."""
    out = []
    for name, (lo, hi) in ci.items():
        p = law.param(name)
        shown = f"{name} [{lo if lo is None else f'{lo:.3g}'}, {hi if hi is None else f'{hi:.3g}'}]"
        if lo is None or hi is None:
            why = f"the 95% interval {shown} has an open end: resamples run {name} off to infinity"
        elif p.kind == "scale":
            if lo > 0 and np.log10(hi / lo) <= th.max_decades:
                continue
            span = f"{np.log10(hi / lo):.1f} decades" if lo > 0 else "down to zero"
            why = f"the 95% interval {shown} spans {span} (more than {th.max_decades:g})"
        else:
            limit = min(th.max_exponent_width, (p.bounds[1] - p.bounds[0]) / 2)
            if hi - lo <= limit:
                continue
            why = f"the 95% interval {shown} is {hi - lo:.3g} wide (more than {limit:g})"
        out.append(problem(*where, "interval", why + ": the data do not determine it",
                           _more_of(law, name) + " (and more trunks, so that every resample sees that range)"))
    return out


def _dlog_columns(law: Law, table: Table) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(log of each column as the law reads it, its derivative with respect to log of the column)."""
    logs = law.log_columns(table)
    deriv = {}
    for c in law.columns:
        v = np.asarray(table[c], dtype=float)
        deriv[c] = v / (1.0 + v) if (law.exact and c == "D2") else np.ones_like(v)
    return logs, deriv


def slope(law: Law, params: Mapping[str, float], table: Table, along: Sequence[str]) -> np.ndarray:
    """dL/dt at each row of ``table`` when every column of ``along`` is multiplied by e^t together (one column: the
    derivative in its log; D1 and D2 together: along the D* path). Exact, from the law's terms; negative where the
    loss falls."""
    logs, deriv = _dlog_columns(law, table)
    n = len(next(iter(logs.values())))
    total = np.zeros(n)
    for term in law.terms:
        log_t = np.full(n, np.log(float(params[term.scale])))
        d_log_t = np.zeros(n)
        for m in term.monomials:
            value = m.sign * float(params[m.param])
            log_t = log_t + value * np.prod([logs[c] for c in m.columns], axis=0)
            for i, c in enumerate(m.columns):
                if c in along:
                    others = [logs[o] for j, o in enumerate(m.columns) if j != i]
                    d_log_t = d_log_t + value * deriv[c] * (np.prod(others, axis=0) if others else 1.0)
        with np.errstate(over="ignore", invalid="ignore"):
            total = total + np.exp(log_t) * d_log_t
    return total


def trained_range(law: Law, table: Table, n: int = DEFAULT.grid) -> dict[str, np.ndarray]:
    """A log grid over the box of the law's columns in ``table`` (n values per column, every combination)."""
    axes = []
    for c in law.columns:
        v = np.asarray(table[c], dtype=float)
        v = v[v > 0]
        axes.append(np.geomspace(v.min(), v.max(), n))
    rows = np.array(list(itertools.product(*axes)), dtype=float)
    return {c: rows[:, j] for j, c in enumerate(law.columns)}


def _point(table: Mapping[str, np.ndarray], i: int) -> str:
    return ", ".join(f"{c}={float(v[i]):.3g}" for c, v in table.items())


def _rising(law: Law, params: Mapping[str, float], points: Mapping[str, np.ndarray], along: Sequence[str],
            where: tuple[str, str], place: str, add: str, **extra: Any) -> list[Problem]:
    s = slope(law, params, points, along)
    bad = np.flatnonzero(~(s < 0))
    if not bad.size:
        return []
    i = int(bad[0])
    what = " and ".join(along)
    why = (f"the predicted loss does not fall with {what} {place} (dL/dlog {what} = {s[i]:+.3g} at {_point(points, i)}"
           f"{f' and {bad.size - 1} more point(s)' if bad.size > 1 else ''}): more training would not lower the loss")
    return [problem(*where, "monotone", why, add, **extra)]


def check_monotone(law: Law, params: Mapping[str, float], table: Table, *, where: tuple[str, str],
                   th: Thresholds = DEFAULT) -> list[Problem]:
    """The loss must fall with every column (tokens and sizes) over the trained range: one problem per column where
    it does not."""
    points = trained_range(law, table, th.grid)
    out = []
    for c in law.columns:
        add = (f"more points across {', '.join(law.columns)} where the law turns, so the fit sees the loss keep "
               f"falling with {c}")
        out += _rising(law, params, points, (c,), where, "on the trained range", add)
    return out


def residual_rms(law: Law, params: Mapping[str, float], table: Table) -> float:
    """RMS of prediction − observed (loss units) over ``table``'s rows."""
    loss = np.asarray(table[LOSS], dtype=float)
    return float(np.sqrt(np.mean((law.predict(dict(params), table) - loss) ** 2)))


def check_loo(law: Law, params: Mapping[str, float], table: Table, loo_rms: float | None, *,
              where: tuple[str, str], th: Thresholds = DEFAULT) -> list[Problem]:
    """LOO RMS above ``loo_factor`` times the residual RMS: the fit does not predict the points it leaves out
    (None: not reported, which the refit problems already say)."""
    if loo_rms is None or not np.isfinite(loo_rms):
        return []
    res = residual_rms(law, params, table)
    if loo_rms <= th.loo_factor * res:
        return []
    why = (f"LOO RMS {loo_rms:.3g} is {loo_rms / res:.3g}x the residual RMS {res:.3g} (more than {th.loo_factor:g}x)"
           if res > 0 else f"LOO RMS {loo_rms:.3g} against a residual RMS of 0: the fit passes through every point")
    return [problem(*where, "loo", why + ": points left out are predicted far worse than the noise, single points "
                    "decide the fit", f"more points (repeats and neighbours) across {', '.join(law.columns)}, so that "
                    "no single point decides the fit")]


def check_fit(law: Law, report: Mapping[str, Any], table: Table, *, where: tuple[str, str],
              min_loss: float | None = None, th: Thresholds = DEFAULT) -> list[Problem]:
    """All four checks on one fit report (``upscale fit --json``: params, fixed, ci, loo_rms) and its table."""
    params = report["params"]
    free = [n for n in law.param_names if n not in (report.get("fixed") or {})]
    return [*check_bounds(law, params, free, where=where, min_loss=min_loss, th=th),
            *check_intervals(law, report.get("ci") or {}, where=where, th=th),
            *check_monotone(law, params, table, where=where, th=th),
            *check_loo(law, params, table, report.get("loo_rms"), where=where, th=th)]


def check_dstar(moe: tuple[Law, Mapping[str, float]], up: tuple[Law, Mapping[str, float]],
                results: Sequence[Mapping[str, Any]], *, moe_where: tuple[str, str],
                up_where: tuple[str, str]) -> list[Problem]:
    """At each finite D* the analysis reports (at its N1): the from-scratch law must fall with D, the upcycled law
    with D1, with D2 and along D1 = D2 = D. A problem carries the ``n1`` of the D* it concerns."""
    out = []
    for r in results:
        star, n1 = r.get("dstar"), r.get("n1")
        if star is None or n1 is None or not (np.isfinite(star) and star > 0):
            continue
        place = f"at the D* it reports ({star:.3g} tokens at N1={n1:.3g})"
        add = "points around that D* (D1 and D2 near it), so that D* does not rest on a law that turns there"
        moe_law, moe_params = moe
        out += _rising(moe_law, moe_params, {"D": np.array([star]), "N": np.array([n1])}, ("D",), moe_where, place,
                       add, n1=n1)
        up_law, up_params = up
        point = {"D1": np.array([star]), "D2": np.array([star]), "N1": np.array([n1])}
        for along in (("D1",), ("D2",), ("D1", "D2")):
            out += _rising(up_law, up_params, point, along, up_where, place, add, n1=n1)
    return out


def concerning(problems: Sequence[Problem], upcycled_fit: str, label: str, n1: float | None = None) -> dict[str, Any]:
    """What a D* or a verdict of one upcycling group (its fit named ``upcycled_fit``, its label ``label``) rests on:
    ``{"health": "ok" | "unhealthy", "health_problems": [{"law", "fit", "kind"}, ...]}``. That is every problem of
    the Chinchilla fits (the shared E, the from-scratch law), except the dense law's identifiability (E then comes
    from the from-scratch law alone), and of this group's joint fit; a problem at one D* (``n1``) only there."""
    out = []
    for p in problems:
        if p.get("n1") is not None and n1 is not None and p["n1"] != n1:
            continue
        if p["law"] == "chinchilla":
            ok = not (p["fit"].startswith("dense") and p.get("kind") == "identifiability")
        elif p["law"] == "joint":
            ok = p["fit"] == upcycled_fit or label in p["fit"].removeprefix("upcycled ").split(", ")
        else:
            ok = False
        if ok:
            out.append({"law": p["law"], "fit": p["fit"], "kind": p.get("kind", "other")})
    return {"health": "unhealthy" if out else "ok", "health_problems": out}
