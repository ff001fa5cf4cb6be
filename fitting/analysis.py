"""The paper's analysis as one function: dense, from-scratch and upcycled tables in, a versioned record out.

The procedure (docs/laws.md): E is fitted jointly by the dense and from-scratch Chinchilla laws (the irreducible
loss is the data's, not the architecture's; fitting/shared.py); the from-scratch law is then fitted with that E
fixed, and so is the upcycled `joint` law, once per upcycling group (method, r, n_expert x topk; fitting/groups.py).
Each fit is cluster-bootstrapped over trunks, each bootstrap draw with E at that draw of E's own bootstrap (so its
uncertainty reaches D*), and D* is found at every N1 with every crossing, its 80% and 95% intervals and the closed
form D*(N1), plus a verdict for each (N1, D1, D2) case asked. Each D* and verdict says how far it lies from the
trained ranges (``trained``), flagged as an extrapolation beyond ``extrapolation_factor``.

Every fit made is then checked for health (fitting/health.py: parameters at a bound, bootstrap intervals the data do
not determine, a law whose loss rises with tokens, LOO error far above the noise); each finding is a problem, and
every D* and verdict says (``health``, ``health_problems``) whether it rests on an unhealthy fit.

Before fitting, the measured grid is checked the way `upscale plan` checks a planned one (fitting/identifiability.py):
a law the data cannot identify is not fitted (its parameters would be arbitrary) and the record says which law, why,
and what to add to the grid; everything else is still fitted. Every entry point runs this function: `upscale demo`,
`upscale analyze`, the service's analyses (POST /sweeps/{id}/analysis, the automatic ones, refits) and
``upscale.analyze`` in a notebook; fitting/analysis_plots.py draws its plots.

With ``curves`` (decay ends predicted from trunk curves: fitting/curve_observations.py) the observed rows are
analysed alone first, for the per-point noise that weights the predicted rows and for the D* they give by
themselves; then every fit takes observed and predicted rows together, and each D* carries an ``evidence`` record:
the rows behind its two laws and the share of its precision on predicted ones (fitting/evidence.py), with the
observed-only D* beside it. Without curves nothing of this runs and the record is as before.

Expert upcycling (an "expanded" table) is the same analysis once more per expansion study, on tables mapped from the
parent's and the m·E MoE's from-scratch runs and the expanded ones (fitting/expansion.py); each is the record's
``expansions``, whose D* is D*_expand.

Pure numerics like the rest of fitting/: no CLI, no printing. ``progress`` reports (stage, done, total).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from upscale.fitting import display
from upscale.fitting.answer import (
    EXPANSION,
    UPCYCLING,
    GroupAnswer,
    Words,
    answer_group,
    answer_problems,
    merge_answer,
    size_independent,
    verdict_from_runs,
)
from upscale.fitting.curve_observations import PredictedDecays, is_predicted
from upscale.fitting.dstar import (
    EXTRAPOLATION_FACTOR,
    Limits,
    OutOfRange,
    decide,
    dstar_at,
    dstar_results,
    search_range,
    upcycled_loss,
)
from upscale.fitting.errors import FitError
from upscale.fitting.evidence import dstar_evidence, evidence_problem, point_noise, with_predicted
from upscale.fitting.expansion import expansion_studies, study_label, upcycling_scratch, upcycling_tables
from upscale.fitting.groups import group_label, upcycled_groups
from upscale.fitting.health import check_dstar, concerning
from upscale.fitting.identifiability import Grid, LawCheck, identifiability
from upscale.fitting.laws import Law, get_law
from upscale.fitting.shared import fit_shared_E, shared_problems
from upscale.fitting.summary import FittedLaw, clean, fitted_law, report, report_steps

ANALYSIS_VERSION = 6  # of the record's layout: bump when to_json changes what a reader finds
TABLES = ("dense", "scratch", "upcycled")  # the store's observation kinds
Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass(frozen=True, repr=False)
class LawFit:
    """One law fitted to one table: the ``upscale fit --json`` report (params, intervals, LOO, bootstrap samples...)
    and the fitted law that D* and the verdict take. Printed, a short summary (fitting/display.py)."""

    report: dict[str, Any]
    fitted: FittedLaw

    @property
    def params(self) -> dict[str, float]:
        return self.fitted.params

    @classmethod
    def from_report(cls, rep: dict[str, Any] | None) -> LawFit | None:
        return None if rep is None else cls(rep, fitted_law(rep))

    def __repr__(self) -> str:
        return "\n".join(display.fit_lines(self.report))

    def _repr_html_(self) -> str:
        return display.fit_html(self.report)


def fit_law(law: Law | str, df: pd.DataFrame, fixed: dict[str, float] | None = None, n_boot: int = 0, seed: int = 0,
            workers: int = 1, progress: Callable[[int], None] | None = None,
            fixed_draws: list[dict[str, float] | None] | None = None) -> LawFit:
    """``report`` (fit, LOO, bootstrap) with the fitted law alongside; ``fixed_draws`` as bootstrap.py takes them."""
    the_law = get_law(law) if isinstance(law, str) else law
    rep, _ = report(the_law, df, fixed, n_boot, seed, workers=workers, progress=progress, fixed_draws=fixed_draws)
    return LawFit.from_report(rep)


def refit_problems(law: str, fit: str, rep: dict[str, Any]) -> list[dict[str, str]]:
    """The record's problems for a fit whose LOO or bootstrap refits failed (none when all succeeded): each says how
    many failed, what became of LOO RMS or the intervals, and what to add so that no single point or trunk decides
    the fit."""
    out = []
    if rep.get("loo_failed"):
        out.append({"law": law, "fit": fit, "why": f"{rep['loo_note']}; the fit depends on single points",
                    "add": "more points around the rows named (repeats or neighbours), so that no single point "
                           "decides the fit"})
    boot = rep.get("bootstrap") or {}
    if rep.get("bootstrap_failed"):
        unit = "trunks (independent WSD runs)" if boot.get("unit") == "trunk" else "points"
        out.append({"law": law, "fit": fit, "why": f"{rep['bootstrap_note']}; some resamples cannot pin the law down",
                    "add": f"more {unit}, so that every resample still pins each parameter"})
    return out


@dataclass(frozen=True)
class UpcycledAnalysis:
    """One upcycling group: its `joint` fit (E fixed), D* per N1 (`upscale dstar --json`) and the verdicts; no fit
    (and so no D*) when its data cannot identify the law, the record's ``problems`` say why."""

    group: dict[str, Any]  # {"method", "r", "n_expert", "topk"}; empty when the table has none of those columns
    fit: LawFit | None
    dstar: dict[str, Any] | None
    decisions: list[dict[str, Any]]
    n_points: int = 0
    answer: dict[str, Any] | None = None  # what the answers rest on (fitting/answer.py GroupAnswer.to_json)

    @property
    def label(self) -> str:
        return group_label(self.group)


@dataclass(frozen=True, repr=False)
class Analysis:
    """The result of ``analyze``: the shared E, the from-scratch fit, one ``UpcycledAnalysis`` per group, and the
    problems (laws the data cannot identify, fits that failed, LOO or bootstrap refits that failed, unhealthy fits:
    fitting/health.py) with what to add to the grid; each has a ``kind`` (identifiability, fit, refit, bound,
    interval, monotone, loo), records written before fit health lack it. Printed, a one-page summary."""

    E: float
    E_note: str  # why E was fixed rather than fitted jointly, if it was
    scratch: LawFit | None
    upcycled: list[UpcycledAnalysis]
    n1s: list[float]
    bootstrap: int
    seed: int
    dense_params: dict[str, float] = field(default_factory=dict)  # the dense law of the joint E fit
    problems: list[dict[str, Any]] = field(default_factory=list)  # {"law", "fit", "why", "add", "kind"[, "n1"]}
    points: dict[str, int] = field(default_factory=dict)  # observations per table
    trained: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # table → column → [min, max]
    limits: Limits = field(default_factory=Limits)  # the law's sane region (dstar.Limits), as the caller knew it
    extrapolation_factor: float = EXTRAPOLATION_FACTOR  # beyond this from the trained range an answer is flagged
    E_bootstrap: dict[str, Any] = field(default_factory=dict)  # E's intervals (80%, 95%): fitting/shared.py
    # with curves: the predicted rows (marked predicted), their families' held-out errors, the point noise that
    # weighted them and how many each table got; empty without curves (and then absent from the record)
    curves: dict[str, Any] = field(default_factory=dict)
    # what the answer was asked with, filled by the entry point that ran it (control/analysis_settings.py): source,
    # bootstrap, seed, n1s, and whether decay ends predicted from trunk curves were fitted (how many rows)
    settings: dict[str, Any] = field(default_factory=dict)
    expansions: list[ExpansionAnalysis] = field(default_factory=list)  # expert upcycling, one per study

    def to_json(self) -> dict[str, Any]:
        """Strict JSON (NaN and infinities as null); ``from_json`` reads it back."""
        return clean({"version": ANALYSIS_VERSION, "E": self.E, "E_note": self.E_note,
                      "E_bootstrap": self.E_bootstrap, "n1s": self.n1s,
                      "bootstrap": self.bootstrap, "seed": self.seed, "points": self.points,
                      "dense_params": self.dense_params, "problems": self.problems, "trained": self.trained,
                      "limits": self.limits.to_json(), "extrapolation_factor": self.extrapolation_factor,
                      "scratch": self.scratch.report if self.scratch else None,
                      "upcycled": [{"group": u.group, "label": u.label, "points": u.n_points,
                                    "fit": u.fit.report if u.fit else None, "dstar": u.dstar,
                                    "decisions": u.decisions, "answer": u.answer} for u in self.upcycled],
                      "expansions": [e.to_json() for e in self.expansions],
                      **({"curves": self.curves} if self.curves else {}),
                      **({"settings": self.settings} if self.settings else {})})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Analysis:
        return cls(E=data["E"], E_note=data["E_note"], scratch=LawFit.from_report(data["scratch"]),
                   upcycled=[UpcycledAnalysis(u["group"], LawFit.from_report(u["fit"]), u["dstar"], u["decisions"],
                                              u.get("points", 0), u.get("answer")) for u in data["upcycled"]],
                   n1s=list(data["n1s"]), bootstrap=data["bootstrap"], seed=data["seed"],
                   dense_params=data.get("dense_params", {}), problems=data.get("problems", []),
                   points=data.get("points", {}), trained=data.get("trained", {}),
                   limits=Limits(**data.get("limits", {})),
                   extrapolation_factor=data.get("extrapolation_factor", EXTRAPOLATION_FACTOR),
                   E_bootstrap=data.get("E_bootstrap", {}), curves=data.get("curves", {}),
                   settings=data.get("settings", {}),
                   expansions=[ExpansionAnalysis.from_json(e) for e in data.get("expansions", [])])

    def __repr__(self) -> str:
        return "\n".join(display.analysis_lines(self.to_json()))

    def _repr_html_(self) -> str:
        return display.analysis_html(self.to_json())

    def missing(self, *laws: str) -> str:
        """Why the analysis has no fit of ``laws`` (its problems), as one sentence."""
        why = [f"{p['fit']}: {p['why']}" + (f" ({p['add']})" if p["add"] else "") for p in self.problems
               if p["law"] in laws]
        return "; ".join(why) or "no observations of it"

    def answer_dstars(self, results: list[dict[str, Any]], label: str) -> None:
        """Each D* result of ``dstar_results`` for upcycling group ``label`` made the answer's, as the analysis made
        it (``merge_answer``: the runs' bracket, the weighed forms): so that `upscale dstar`, a decision and the
        analysis give one D* for one N1. Nothing changes where the analysis kept no answer for the group."""
        found = next((u.answer for u in self.upcycled if u.label == label and u.answer is not None), None)
        if found is None:
            return
        group = GroupAnswer.from_json(found)
        for star in results:
            merge_answer(star, group.at(star["n1"]))

    def decision(self, n1: float, d1: float, d2: float, group: str | None = None) -> dict[str, Any]:
        """The verdict for (N1, D1, D2) with D* at N1, from the from-scratch law and one upcycled group's: ``group``
        (a label), by default the group whose law predicts the lowest loss there (the best way to upcycle). Its
        ``health`` and ``health_problems`` say whether it rests on an unhealthy fit (fitting/health.py), its
        ``extrapolation`` how far (N1, D1, D2) lies from the data, ``dstar_extrapolation`` the same for D*.
        FitError when the analysis has no law to answer with; OutOfRange (a FitError) when the answer leaves the
        law's sane region (``limits``)."""
        if self.scratch is None:
            raise FitError(f"the analysis has no from-scratch MoE law: {self.missing('chinchilla')}")
        fitted = [u for u in self.upcycled if u.fit is not None]
        if group is not None:
            labels = [u.label for u in self.upcycled]
            if group not in labels:
                raise FitError(f"no upcycling group {group!r} in the analysis; it has {', '.join(labels) or 'none'}")
            fitted = [u for u in fitted if u.label == group]
        if not fitted:
            raise FitError(f"the analysis has no upcycled law{f' for {group}' if group else ''}: "
                           f"{self.missing('joint')}")
        best = min(fitted, key=lambda u: float(upcycled_loss(u.fit.fitted, n1, np.array([d1]), np.array([d2]))[0]))
        factor = self.extrapolation_factor
        verdict = decide(self.scratch.fitted, best.fit.fitted, n1, d1, d2, self.limits, factor).to_json()
        star = dstar_at(self.scratch.fitted, best.fit.fitted, n1, factor)
        no_size = size_independent(best.fit.fitted, self.scratch.fitted, n1, d1, d2)
        if no_size:
            verdict |= {"verdict": "undecided", "verdict_note": no_size}
        if best.answer is not None:  # the answer as the analysis made it: the runs first, the weighed forms
            group = GroupAnswer.from_json(best.answer)
            group.check_point(n1, d1, d2)
            merge_answer(star, group.at(n1))
            verdict = verdict_from_runs(verdict, group.observed, group.words)
        fit = f"upcycled {best.label}" if best.label else "upcycled"
        return clean({**verdict, "dstar": star["dstar"], "dstar_state": star["dstar_state"],
                      "dstar_search_range": star["search_range"],
                      "dstar_intervals": star["intervals"], "dstar_interval_note": star["interval_note"],
                      "dstar_extrapolation": star["extrapolation"], "dstar_answer": star.get("answer"),
                      "group": best.label, **concerning(self.problems, fit, best.label, n1)})


@dataclass(frozen=True, repr=False)
class ExpansionAnalysis:
    """One expansion study (fitting/expansion.py): the analysis of its three mapped tables, whose D* is D*_expand;
    none when an arm is missing (``missing``: each {"arm", "why", "add"}). ``points`` counts each arm's rows."""

    group: dict[str, Any]  # {"parent_experts", "n_expert", "topk", "method", "r"}
    analysis: Analysis | None
    missing: list[dict[str, str]] = field(default_factory=list)
    points: dict[str, int] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return study_label(self.group)

    @property
    def dstar(self) -> dict[str, Any] | None:
        """D*_expand per N1 (`upscale dstar --json`'s layout), when the study's laws were fitted."""
        return self.analysis.upcycled[0].dstar if self.analysis and self.analysis.upcycled else None

    def decision(self, n1: float, d1: float, d2: float) -> dict[str, Any]:
        """Expand the parent or train the m·E MoE from scratch at (N1, D1 parent tokens, D2 after expansion), as
        ``Analysis.decision`` answers for upcycling, its verdicts "expand", "scratch" or "undecided" (the loss and
        probability keep upcycling's names: ``loss_upcycled`` is the expanded model's); FitError when the study was
        not analysed."""
        if self.analysis is None:
            raise FitError(f"{self.label} was not analysed: " + "; ".join(m["why"] for m in self.missing))
        out = self.analysis.decision(n1, d1, d2)
        said = {k: EXPANSION.said(out[k]) for k in ("verdict", "law_verdict") if k in out}
        if out.get("observed"):
            said["observed"] = {**out["observed"], "leader": EXPANSION.said(out["observed"]["leader"])}
        return {**out, **said}

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "label": self.label, "points": self.points, "missing": self.missing,
                "analysis": self.analysis.to_json() if self.analysis else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExpansionAnalysis:
        inner = data.get("analysis")
        return cls(data["group"], Analysis.from_json(inner) if inner else None, data.get("missing", []),
                   data.get("points", {}))

    def __repr__(self) -> str:
        return "\n".join(display.expansion_lines(self.to_json()))


def observed_grid(dense: pd.DataFrame, scratch: pd.DataFrame,
                  groups: Sequence[tuple[dict[str, Any], pd.DataFrame]]) -> Grid:
    """The measured coordinates, as fitting/identifiability.py checks them."""
    def rows(df: pd.DataFrame, columns: tuple[str, ...]) -> tuple[tuple[float, ...], ...]:
        return tuple(sorted({tuple(float(v) for v in r) for r in df[list(columns)].dropna().itertuples(index=False)}))

    return Grid(rows(dense, ("N", "D")), rows(scratch, ("N", "D")),
                {group_label(g): rows(part, ("N1", "D1", "D2")) for g, part in groups})


def _problem(check: LawCheck) -> dict[str, str]:
    return {"law": check.law, "fit": check.fit, "why": check.reason, "add": check.add, "kind": "identifiability"}


def _fittable(check: LawCheck | None) -> bool:
    """Fit unless the grid leaves a parameter free; a fit that merely passes through every point is still made
    (and its problem still reported)."""
    return check is None or check.identifiable or not check.unidentified


def _named(problems: list[dict[str, Any]], fit: str) -> list[dict[str, Any]]:
    """A fit report's health problems as the analysis names that fit."""
    return [{**p, "fit": fit} for p in problems]


def _kind(problems: list[dict[str, str]], kind: str) -> list[dict[str, Any]]:
    return [{**p, "kind": kind} for p in problems]


def _mark_health(star: dict[str, Any], verdicts: list[dict[str, Any]], problems: list[dict[str, Any]], fit: str,
                 label: str) -> None:
    """Each D* (per N1, and the group's as a whole) and each verdict says whether it rests on an unhealthy fit:
    ``health`` ("ok" | "unhealthy") and ``health_problems`` ({"law", "fit", "kind"} of each problem it rests on)."""
    star.update(concerning(problems, fit, label))
    for r in star["results"]:
        r.update(concerning(problems, fit, label, r["n1"]))
    for v in verdicts:
        v.update(concerning(problems, fit, label, v["n1"]))


def _verdict(moe: LawFit, up: LawFit, case: tuple[float, float, float], limits: Limits | None,
             factor: float) -> dict[str, Any]:
    """One asked verdict's JSON; a case the law cannot speak to is kept with ``refused`` saying why."""
    try:
        return decide(moe.fitted, up.fitted, *case, limits, factor).to_json()
    except OutOfRange as e:
        return {"n1": case[0], "d1": case[1], "d2": case[2], "verdict": None, "refused": str(e)}


def trained_ranges(dense: pd.DataFrame, scratch: pd.DataFrame, upcycled: pd.DataFrame) -> dict[str, dict[str, list]]:
    """Each table's columns as [min, max] over its observed rows (predicted decay ends are not trained points): what
    the answers are measured against (extrapolation)."""
    columns = {"dense": (dense, ("N", "D")), "scratch": (scratch, ("N", "D")),
               "upcycled": (upcycled, ("N1", "D1", "D2"))}
    observed = {name: df[~is_predicted(df)] for name, (df, _) in columns.items()}
    return {name: {c: [float(observed[name][c].min()), float(observed[name][c].max())] for c in cols}
            for name, (_, cols) in columns.items() if not observed[name].empty}


def _extreme_cases(n1s: Sequence[float], rows: pd.DataFrame) -> list[tuple[float, float, float]]:
    """The verdicts asked by default: the grid's smallest and biggest (N1, D1, D2)."""
    return [(min(n1s), float(rows["D1"].min()), float(rows["D2"].min())),
            (max(n1s), float(rows["D1"].max()), float(rows["D2"].max()))]


def _stages(progress: Progress | None) -> Callable[[str, int], Callable[[int], None] | None]:
    """report()'s advance-by-k callbacks as (stage, done, total) calls."""
    def stage(name: str, total: int) -> Callable[[int], None] | None:
        if progress is None or total <= 0:
            return None
        done = 0
        progress(name, 0, total)

        def advance(k: int) -> None:
            nonlocal done
            done += k
            progress(name, done, total)
        return advance
    return stage


def analyze(tables: Mapping[str, pd.DataFrame], n1s: Sequence[float] | None = None,
            decisions: Sequence[tuple[float, float, float]] | None = None, bootstrap: int = 200, seed: int = 0,
            workers: int = 1, progress: Progress | None = None, limits: Limits | None = None,
            extrapolation_factor: float = EXTRAPOLATION_FACTOR, curves: PredictedDecays | None = None,
            answers: bool = True) -> Analysis:
    """The paper's analysis of ``tables`` ("dense" and "scratch": columns D, N, loss[, trunk]; "upcycled": D1, D2,
    N1, loss[, trunk, method, r, n_expert, topk]).

    ``n1s``: the model sizes to find D* at (default: the dense table's sizes, else the upcycled table's N1); D* is
    searched from 100x below the smallest trained budget to 100x above the largest, its closed form fitted over the
    trained sizes. ``decisions``: (N1, D1, D2) cases to give a verdict for (default: the grid's smallest and
    biggest); one outside ``limits`` (the law's sane region) is kept with the reason it was refused. Every D* and
    verdict says how far it lies from the trained ranges (the record's ``trained``), flagged beyond
    ``extrapolation_factor``. ``bootstrap`` cluster-bootstrap refits per fit (0: no intervals); ``workers``
    processes for them. ``progress(stage, done, total)`` is called as each stage moves on. ``curves``: decay ends
    predicted from trunk curves (`predicted_decays`), fitted beside the observed ones (see the module docstring).
    ``answers`` False: the paper's pair of laws alone, without the law forms, backtests and the runs' bracket
    (docs/laws.md, "The answer beyond one law"): what every answer was before them, kept for comparison and as the
    cost baseline of bench/real_answer.py. FitError only when a table is missing or there is nothing to analyse.

    An optional "expanded" table (expert upcycling: D1, D2, N1, loss, parent_experts, n_expert, topk, method, r)
    adds one analysis per expansion study (fitting/expansion.py), on observed rows, with the N1s asked: the record's
    ``expansions``, each with its D*_expand. Expanded rows never enter the dense->MoE analysis, nor do the
    from-scratch rows of a configuration only an expansion study uses (its rival, or a parent grown in no dense
    upcycling).
    """
    out = _upcycling(upcycling_tables(tables), n1s, decisions, bootstrap, seed, workers, progress, limits,
                     extrapolation_factor, curves, answers)
    return replace(out, expansions=_expansions(tables, n1s, bootstrap, seed, workers, progress, limits,
                                               extrapolation_factor, answers))


def _upcycling(tables: Mapping[str, pd.DataFrame], n1s: Sequence[float] | None,
               decisions: Sequence[tuple[float, float, float]] | None, bootstrap: int, seed: int, workers: int,
               progress: Progress | None, limits: Limits | None, extrapolation_factor: float,
               curves: PredictedDecays | None, answers: bool) -> Analysis:
    """``analyze`` of dense->MoE upcycling alone: the observed rows, or with ``curves`` their predicted ones too."""
    args = (decisions, bootstrap, seed, workers, progress, limits, extrapolation_factor)
    if curves is not None and "scratch" in curves.tables:  # a rival's trunk predicts from-scratch decays too
        curves = replace(curves, tables={**curves.tables,
                                         "scratch": upcycling_scratch(curves.tables["scratch"], tables)})
    if curves is None:
        return _analyze(tables, n1s, *args, answers=answers)
    if not curves.n_rows:  # nothing predicted: the observed analysis, with the families' reasons on record
        return replace(_analyze(tables, n1s, *args), curves={"families": curves.families, "points": {}})
    observed = _analyze(tables, n1s, decisions, 0, seed, workers, None, limits, extrapolation_factor, answers=False)
    noise = point_noise(_observed_fits(observed, tables))
    combined = with_predicted({k: tables[k] for k in TABLES}, curves, noise.point_sd)
    out = _analyze(combined, observed.n1s, *args, answers=answers)
    _weigh_evidence(out, observed, combined)
    predicted = {k: int(is_predicted(df).sum()) for k, df in combined.items()}
    record = curves.to_json()
    for kind, rows in record["rows"].items():
        weights = combined[kind].loc[is_predicted(combined[kind]), "weight"].tolist()
        record["rows"][kind] = [{**r, "weight": w} for r, w in zip(rows, weights, strict=True)]
    points = {k: n - predicted[k] for k, n in out.points.items()}
    groups = [replace(u, n_points=u.n_points - int(is_predicted(rows).sum()))
              for u, (_, rows) in zip(out.upcycled, _groups(combined), strict=True)]
    return replace(out, points=points, upcycled=groups,
                   curves={**record, "points": predicted, "noise": noise.to_json()})


def _expansions(tables: Mapping[str, pd.DataFrame], n1s: Sequence[float] | None, bootstrap: int, seed: int,
                workers: int, progress: Progress | None, limits: Limits | None, extrapolation_factor: float,
                answers: bool) -> list[ExpansionAnalysis]:
    """Each expansion study of ``tables`` (its "expanded" rows; fitting/expansion.py) analysed as upcycling is, on
    its observed rows; one lacking an arm, or whose analysis finds nothing to fit, is kept with why."""
    out = []
    for study in expansion_studies(dict(tables)):
        if study.missing:
            out.append(ExpansionAnalysis(study.group, None, study.missing, study.points))
            continue
        def stage(name: str, done: int, total: int, label: str = study.label) -> None:
            if progress is not None:
                progress(f"{label}: {name}", done, total)
        try:
            sub = _analyze(study.tables, n1s, None, bootstrap, seed, workers, stage, limits, extrapolation_factor,
                           answers=answers, words=EXPANSION)
        except FitError as e:
            out.append(ExpansionAnalysis(study.group, None, [{"arm": "analysis", "why": str(e), "add": ""}],
                                         study.points))
        else:
            out.append(ExpansionAnalysis(study.group, sub, [], study.points))
    return out


def _groups(tables: Mapping[str, pd.DataFrame]) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """The upcycled table's groups, as ``_analyze`` splits it."""
    upcycled = tables["upcycled"].dropna(subset=["loss"]).reset_index(drop=True)
    return upcycled_groups(upcycled) if not upcycled.empty else []


def _observed_fits(observed: Analysis, tables: Mapping[str, pd.DataFrame]) -> list[tuple[Any, dict, pd.DataFrame]]:
    """The observed-only analysis's fits with their tables, for the point noise that weights predicted rows."""
    fits = []
    if observed.scratch is not None:
        fits.append((observed.scratch.fitted, observed.scratch.report["fixed"],
                     tables["scratch"].dropna(subset=["loss"]).reset_index(drop=True)))
    rows = {group_label(g): part for g, part in _groups(tables)}
    fits += [(u.fit.fitted, u.fit.report["fixed"], rows[u.label]) for u in observed.upcycled if u.fit is not None]
    return fits


def _weigh_evidence(out: Analysis, observed: Analysis, combined: Mapping[str, pd.DataFrame]) -> None:
    """Every D* of ``out`` gets its ``evidence`` (fitting/evidence.py) with the observed-only D* beside it; a D*
    that rests mostly on predicted rows is a problem, and its health (and its group's verdicts') is marked again."""
    if out.scratch is None:
        return
    scratch = combined["scratch"].dropna(subset=["loss"]).reset_index(drop=True)
    rows = {group_label(g): part for g, part in _groups(combined)}
    alone = {u.label: {r["n1"]: r["dstar"] for r in u.dstar["results"]} for u in observed.upcycled if u.dstar}
    moe = (out.scratch.fitted, out.scratch.report["fixed"], scratch)
    for u in out.upcycled:
        if u.dstar is None or u.fit is None:
            continue
        fit = f"upcycled {u.label}" if u.label else "upcycled"
        for r in u.dstar["results"]:
            evidence = dstar_evidence(moe, (u.fit.fitted, u.fit.report["fixed"], rows[u.label]), r["n1"])
            r["evidence"] = clean({**evidence, "observed_dstar": alone.get(u.label, {}).get(r["n1"])})
            found = evidence_problem(evidence, r["n1"], "joint", fit)
            if found is not None:
                out.problems.append(found)
        _mark_health(u.dstar, u.decisions, out.problems, fit, u.label)


def _answer(scratch: pd.DataFrame, rows: pd.DataFrame, sizes: list[float], moe: LawFit,
            up: LawFit, E: float, E_draws: list[dict[str, float] | None] | None, bootstrap: int, seed: int,
            stage: Callable[[str, int], Callable[[int], None] | None],
            where: str, words: Words) -> tuple[GroupAnswer, list[dict[str, Any]]]:
    """fitting/answer.py's answer for one group: every form fitted, backtested and weighed, at every size."""
    advance = stage(f"law forms, backtests ({words.runs}{where})", 1)
    out = answer_group({"scratch": scratch, "upcycled": rows}, sizes,
                       search_range(moe.fitted, up.fitted),
                       {"scratch": (moe.params, moe.fitted.samples), "upcycled": (up.params, up.fitted.samples)},
                       E, E_draws, bootstrap, seed, words)
    if advance:
        advance(1)
    return out


def _analyze(tables: Mapping[str, pd.DataFrame], n1s: Sequence[float] | None,
             decisions: Sequence[tuple[float, float, float]] | None, bootstrap: int, seed: int, workers: int,
             progress: Progress | None, limits: Limits | None, extrapolation_factor: float,
             answers: bool = True, words: Words = UPCYCLING) -> Analysis:
    """``analyze`` of the tables as they are (observed rows, or observed and predicted ones); ``answers`` False:
    the paper's laws alone (the observed-only pass of a curves analysis, which needs only their noise and D*);
    ``words``: how the answers name the arm that starts ahead (an expansion study's)."""
    missing = [k for k in TABLES if k not in tables]
    if missing:
        raise FitError(f"analyze needs the tables {', '.join(TABLES)}; missing {', '.join(missing)}")
    dense, scratch, upcycled = (tables[k].dropna(subset=["loss"]).reset_index(drop=True) for k in TABLES)
    if dense.empty and scratch.empty and upcycled.empty:
        raise FitError("no observations to analyse: no segment with a loss has finished yet")
    known = dense["N"] if not dense.empty else upcycled["N1"] if not upcycled.empty else scratch["N"]
    sizes = sorted(float(n) for n in (n1s if n1s is not None else known.dropna().unique()))
    if not sizes:
        raise FitError("no model size N1 to find D* at: the tables have none and no n1s were given")
    groups = upcycled_groups(upcycled) if not upcycled.empty else []
    checks = identifiability(observed_grid(dense, scratch, groups))
    problems = [_problem(c) for c in checks if not c.identifiable and c.law in ("chinchilla", "joint", "D*")]
    dense_check = next(c for c in checks if c.law == "chinchilla" and c.fit.startswith("dense"))
    scratch_check = next(c for c in checks if c.law == "chinchilla" and c.fit.startswith("from-scratch"))
    stage = _stages(progress)

    shared = stage("shared E (dense + from scratch)", 1)
    use_scratch = not scratch.empty and _fittable(scratch_check)
    use_dense = not dense.empty and _fittable(dense_check)
    joint_E = fit_shared_E(dense if use_dense else None, scratch if use_scratch else None, bootstrap, seed)
    E, note, dense_params, E_draws = joint_E.E, joint_E.note, joint_E.dense_params, joint_E.fixed_draws()
    problems += shared_problems(joint_E, dense if use_dense else None, scratch if use_scratch else None)
    if shared:
        shared(1)
    chin, joint = get_law("chinchilla"), get_law("joint")
    moe = None
    if use_scratch:
        try:
            moe = fit_law(chin, scratch, {"E": E}, bootstrap, seed, workers,
                          stage("LOO, bootstrap (from scratch)", report_steps(scratch, bootstrap)), E_draws)
        except FitError as e:
            problems.append({"law": "chinchilla", "fit": "from-scratch MoE", "why": str(e), "add": "", "kind": "fit"})
        else:
            problems += _kind(refit_problems("chinchilla", "from-scratch MoE", moe.report), "refit")
            problems += _named(moe.report["problems"], "from-scratch MoE")
    out = []
    for group, rows in groups:
        label = group_label(group)
        where = f" {label}" if label else ""
        check = next((c for c in checks if c.law == "joint" and label in c.groups), None)
        up = star = group_answer = None
        verdicts: list[dict[str, Any]] = []
        if _fittable(check):
            try:
                up = fit_law(joint, rows, {"E": E}, bootstrap, seed, workers,
                             stage(f"LOO, bootstrap ({words.runs}{where})", report_steps(rows, bootstrap)), E_draws)
            except FitError as e:
                problems.append({"law": "joint", "fit": f"upcycled{where}", "why": str(e), "add": "", "kind": "fit"})
            else:
                problems += _kind(refit_problems("joint", f"upcycled{where}", up.report), "refit")
                problems += _named(up.report["problems"], f"upcycled{where}")
        if up is not None and moe is not None:
            advance = stage(f"{words.dstar} ({words.runs}{where})", 1)
            star = dstar_results(moe.fitted, up.fitted, sizes, extrapolation_factor)
            problems += check_dstar((chin, moe.params), (joint, up.params), star["results"],
                                    moe_where=("chinchilla", "from-scratch MoE"),
                                    up_where=("joint", f"upcycled{where}"))
            cases = decisions if decisions is not None else _extreme_cases(sizes, rows)
            verdicts = [_verdict(moe, up, case, limits, extrapolation_factor) for case in cases]
            if answers:
                group_answer = _answer(scratch, rows, sizes, moe, up, E, E_draws, bootstrap, seed, stage, where,
                                       words)
                for r, a in zip(star["results"], group_answer[1], strict=True):
                    merge_answer(r, a)
                verdicts = [verdict_from_runs(v, group_answer[0].observed, words) for v in verdicts]
                problems += answer_problems(group_answer[1], f"upcycled{where}", words)
            _mark_health(star, verdicts, problems, f"upcycled{where}", label)
            if advance:
                advance(1)
        out.append(UpcycledAnalysis(group, up, star, verdicts, len(rows),
                                    group_answer[0].to_json() if group_answer else None))
    return Analysis(E, note, moe, out, sizes, bootstrap, seed, dense_params, problems,
                    {"dense": len(dense), "scratch": len(scratch), "upcycled": len(upcycled)},
                    trained_ranges(dense, scratch, upcycled), limits or Limits(), extrapolation_factor,
                    joint_E.to_json())
