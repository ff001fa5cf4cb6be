"""The paper's analysis as one function: dense, from-scratch and upcycled tables in, fits, D* and verdicts out.

The procedure (docs/laws.md): E is fitted jointly by the dense and from-scratch Chinchilla laws (the irreducible
loss is the data's, not the architecture's); the from-scratch law is then fitted with that E fixed, and so is the
upcycled `joint` law, once per upcycling group (method, r) of the upcycled table. Each fit is cluster-bootstrapped
over trunks, and D* is found at every N1 with every crossing, its interval and the closed form D*(N1), plus a verdict
for each (N1, D1, D2) case asked. `upscale demo` prints and plots an ``Analysis``, and records its fits in the store
so that `upscale decide` and `upscale dstar` can use them; ``upscale.analyze`` is this function for notebooks.

Pure numerics like the rest of fitting/: no CLI, no printing. ``progress`` reports (stage, done, total).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from upscale.fitting.dstar import decide, dstar_results
from upscale.fitting.errors import FitError
from upscale.fitting.fit import fit_shared, split_shared
from upscale.fitting.laws import Law, get_law
from upscale.fitting.summary import FittedLaw, clean, fitted_law, group_keys, report, report_steps

TABLES = ("dense", "scratch", "upcycled")  # the store's observation kinds
GROUP_COLUMNS = ("method", "r")  # an upcycled table is fitted once per upcycling method and drop ratio
Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass(frozen=True)
class LawFit:
    """One law fitted to one table: the ``upscale fit --json`` report (params, intervals, bootstrap samples...) and
    the fitted law that D* and the verdict take."""

    report: dict[str, Any]
    fitted: FittedLaw

    @property
    def params(self) -> dict[str, float]:
        return self.fitted.params

    @classmethod
    def from_report(cls, rep: dict[str, Any]) -> LawFit:
        return cls(rep, fitted_law(rep))


def fit_law(law: Law | str, df: pd.DataFrame, fixed: dict[str, float] | None = None, n_boot: int = 0, seed: int = 0,
            workers: int = 1, progress: Callable[[int], None] | None = None) -> LawFit:
    """``report`` (fit, LOO, bootstrap) with the fitted law alongside."""
    the_law = get_law(law) if isinstance(law, str) else law
    rep, boot = report(the_law, df, fixed, n_boot, seed, workers=workers, progress=progress)
    return LawFit(rep, FittedLaw(the_law, rep["params"], boot.samples if boot else None))


@dataclass(frozen=True)
class UpcycledAnalysis:
    """One upcycling group: its `joint` fit (E fixed), D* per N1 (`upscale dstar --json`) and the verdicts."""

    group: dict[str, Any]  # {"method": ..., "r": ...}; empty when the table has no method column
    fit: LawFit
    dstar: dict[str, Any]
    decisions: list[dict[str, Any]]

    @property
    def label(self) -> str:
        return group_label(self.group)


@dataclass(frozen=True)
class Analysis:
    """The result of ``analyze``: the shared E, the from-scratch fit and one ``UpcycledAnalysis`` per group."""

    E: float
    E_note: str  # why E was fixed rather than fitted jointly, if it was
    scratch: LawFit
    upcycled: list[UpcycledAnalysis]
    n1s: list[float]
    bootstrap: int
    seed: int
    dense_params: dict[str, float] = field(default_factory=dict)  # the dense law of the joint E fit

    def to_json(self) -> dict[str, Any]:
        """Strict JSON (NaN and infinities as null); ``from_json`` reads it back."""
        return clean({"E": self.E, "E_note": self.E_note, "n1s": self.n1s, "bootstrap": self.bootstrap,
                      "seed": self.seed, "dense_params": self.dense_params, "scratch": self.scratch.report,
                      "upcycled": [{"group": u.group, "fit": u.fit.report, "dstar": u.dstar,
                                    "decisions": u.decisions} for u in self.upcycled]})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Analysis:
        return cls(E=data["E"], E_note=data["E_note"], scratch=LawFit.from_report(data["scratch"]),
                   upcycled=[UpcycledAnalysis(u["group"], LawFit.from_report(u["fit"]), u["dstar"], u["decisions"])
                             for u in data["upcycled"]],
                   n1s=list(data["n1s"]), bootstrap=data["bootstrap"], seed=data["seed"],
                   dense_params=data.get("dense_params", {}))


def group_label(group: dict[str, Any]) -> str:
    """An upcycling group as people read it: ``naive``, ``drop r=0.5``; empty for an ungrouped table."""
    method, r = group.get("method"), group.get("r")
    return "" if method is None else str(method) if r is None else f"{method} r={r:g}"


def upcycled_groups(upcycled: pd.DataFrame) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """The upcycled table split by method and r (the columns it has of those); one group when it has neither."""
    by = [c for c in GROUP_COLUMNS if c in upcycled.columns and upcycled[c].notna().any()]
    if not by:
        return [({}, upcycled.reset_index(drop=True))]
    return [({c: key.get(c) for c in GROUP_COLUMNS}, part) for key, part in group_keys(upcycled, by)]


def shared_E(dense: pd.DataFrame, scratch: pd.DataFrame) -> tuple[float, str, dict[str, float]]:
    """E of the dense and from-scratch Chinchilla laws fitted jointly, why it was fixed instead (if it was), and
    the dense law's parameters of that fit."""
    chin = get_law("chinchilla")
    try:
        result = fit_shared({"dense": (chin, dense), "moe": (chin, scratch)}, shared=("E",))
    except FitError as e:  # a small grid may not pin E down: the fit drives it to 0; say so and carry on
        E = chin.param("E").bounds[0]
        return E, f"E is not identified by this grid ({e}); fixed at {E:g}, the low end of its plausible range", {}
    return result.params["E"], "", split_shared(result, "dense", chin)


def _extreme_cases(n1s: Sequence[float], rows: pd.DataFrame) -> list[tuple[float, float, float]]:
    """The verdicts asked by default: the grid's smallest and biggest (N1, D1, D2)."""
    return [(min(n1s), float(rows["D1"].min()), float(rows["D2"].min())),
            (max(n1s), float(rows["D1"].max()), float(rows["D2"].max()))]


def analyze(tables: Mapping[str, pd.DataFrame], n1s: Sequence[float] | None = None,
            decisions: Sequence[tuple[float, float, float]] | None = None, bootstrap: int = 200, seed: int = 0,
            workers: int = 1, progress: Progress | None = None) -> Analysis:
    """The paper's analysis of ``tables`` ("dense" and "scratch": columns D, N, loss[, trunk]; "upcycled": D1, D2,
    N1, loss[, trunk, method, r]).

    ``n1s``: the model sizes to find D* at (default: the dense table's sizes); D* is searched and its closed form
    fitted over a decade either side. ``decisions``: (N1, D1, D2) cases to give a verdict for (default: the grid's
    smallest and biggest). ``bootstrap`` cluster-bootstrap refits per fit (0: no intervals); ``workers`` processes
    for them. ``progress(stage, done, total)`` is called as each stage moves on.
    """
    missing = [k for k in TABLES if k not in tables]
    if missing:
        raise FitError(f"analyze needs the tables {', '.join(TABLES)}; missing {', '.join(missing)}")
    dense, scratch, upcycled = (tables[k] for k in TABLES)
    sizes = sorted(float(n) for n in (n1s if n1s is not None else dense["N"].dropna().unique()))
    if not sizes:
        raise FitError("no model size N1 to find D* at: the dense table is empty and no n1s were given")
    groups = upcycled_groups(upcycled)

    def stage(name: str, total: int) -> Callable[[int], None] | None:
        """report()'s advance-by-k callback as (stage, done, total) calls."""
        if progress is None or total <= 0:
            return None
        done = 0
        progress(name, 0, total)

        def advance(k: int) -> None:
            nonlocal done
            done += k
            progress(name, done, total)
        return advance

    shared = stage("shared E (dense + from scratch)", 1)
    E, note, dense_params = shared_E(dense, scratch)
    if shared:
        shared(1)
    moe = fit_law("chinchilla", scratch, {"E": E}, bootstrap, seed, workers,
                  stage("LOO, bootstrap (from scratch)", report_steps(scratch, bootstrap)))
    out = []
    for group, rows in groups:
        where = f" {group_label(group)}" if group else ""
        try:
            up = fit_law("joint", rows, {"E": E}, bootstrap, seed, workers,
                         stage(f"LOO, bootstrap (upcycled{where})", report_steps(rows, bootstrap)))
        except FitError as e:
            raise FitError(f"upcycled{where}: {e}") from None
        advance = stage(f"D* (upcycled{where})", 1)
        star = dstar_results(moe.fitted, up.fitted, sizes, (min(sizes) / 10, max(sizes) * 10))
        cases = decisions if decisions is not None else _extreme_cases(sizes, rows)
        verdicts = [decide(moe.fitted, up.fitted, *case).to_json() for case in cases]
        if advance:
            advance(1)
        out.append(UpcycledAnalysis(group, up, star, verdicts))
    return Analysis(E, note, moe, out, sizes, bootstrap, seed, dense_params)
