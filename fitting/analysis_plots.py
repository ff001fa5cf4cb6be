"""The plots of an analysis (fitting/analysis.py), as a researcher would put them in a paper: what every entry point
draws (`upscale demo`, `upscale analyze --plot`, the service's analyses).

In ``out_dir``, each as PNG and PDF:

- ``dstar``: D*(N1) of every upcycling group with a fit, its bootstrap band and its closed form as a formula;
- ``scratch_loss_vs_d``, ``scratch_parity``, ``scratch_residuals``: the from-scratch MoE law;
- ``dense_loss_vs_d``: the dense law of the shared-E fit;
- per upcycling group, in its folder (fitting.groups.group_slug, e.g. ``naive_8x2/``): ``loss_vs_d2`` (a panel per
  N1), ``parity``, ``residuals``, ``alpha_d1``, ``catch_up`` (loss against tokens with the crossings marked) and
  ``backtest`` (each law form's error on held-out runs against how far beyond its fitted range they lay, with the
  calibrated bands);
- per expansion study (expert upcycling), in its folder (``expand_4x1_8x1_uniform/``): ``dstar`` (D*_expand over
  N1) and the group plots above, of its expanded rows against the m·E MoE from scratch.

A plot the data cannot support (no fit of its law, a grid too small for alpha(D1)) is skipped with a line saying
why; ``draw_analysis`` never raises for one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from upscale.fitting import plots
from upscale.fitting.analysis import Analysis, ExpansionAnalysis, UpcycledAnalysis
from upscale.fitting.curve_observations import is_predicted
from upscale.fitting.diagnostics import alpha_d1
from upscale.fitting.expansion import Study, expansion_studies
from upscale.fitting.groups import as_slug, group_label, group_slug, upcycled_groups
from upscale.fitting.laws import LOSS, WEIGHT, get_law
from upscale.fitting.plots import DrawnPlots, DstarCurve
from upscale.fitting.summary import FittedLaw

__all__ = ["DrawnPlots", "draw_analysis"]

BAND_POINTS = 8  # model sizes on the D*(N1) plot
CATCH_UP_D1S = 3  # sunk costs drawn on a catch-up plot
GROUP_PLOTS = ("loss_vs_d2", "parity", "residuals", "alpha_d1", "backtest", "catch_up")


def _rows(tables: Mapping[str, pd.DataFrame], kind: str) -> pd.DataFrame:
    df = tables.get(kind)
    if df is None or df.empty or LOSS not in df.columns:
        return pd.DataFrame()
    return df.dropna(subset=[LOSS]).reset_index(drop=True)


def _why_no_fit(analysis: Analysis, up: UpcycledAnalysis) -> str:
    """The problems of this group's law (the analysis's ``missing`` names every group's)."""
    where = f"upcycled {up.label}".strip()
    why = [f"{p['why']}" + (f" ({p['add']})" if p["add"] else "") for p in analysis.problems
           if p["law"] == "joint" and p["fit"].startswith(where)]
    return "; ".join(why) or analysis.missing("joint")


def _sunk_costs(up: UpcycledAnalysis, rows: pd.DataFrame) -> list[float]:
    """The D1 of the verdicts asked and the grid's middle one, at most CATCH_UP_D1S of them."""
    d1s = sorted({float(d["d1"]) for d in up.decisions} | {float(rows["D1"].median())})
    if len(d1s) > CATCH_UP_D1S:
        d1s = [d1s[0], d1s[len(d1s) // 2], d1s[-1]]
    return d1s


def _draw_scratch(analysis: Analysis, tables: Mapping[str, pd.DataFrame], out: Path, drawn: DrawnPlots) -> None:
    names = ("scratch_loss_vs_d", "scratch_parity", "scratch_residuals")
    scratch = _rows(tables, "scratch")
    if analysis.scratch is None or scratch.empty:
        for name in names:
            drawn.skip(name, f"no from-scratch MoE law: {analysis.missing('chinchilla')}")
    else:
        fit, title = analysis.scratch.fitted, "MoE from scratch (chinchilla, E shared)"
        observed = scratch[~is_predicted(scratch)].reset_index(drop=True)
        drawn.attempt(out, names[0], lambda p: plots.loss_vs_d(fit, scratch, p, title))
        drawn.attempt(out, names[1], lambda p: plots.parity(fit, observed, p, title))
        drawn.attempt(out, names[2], lambda p: plots.residuals(fit, observed, p, title))
    dense = _rows(tables, "dense")
    if not analysis.dense_params or dense.empty:
        drawn.skip("dense_loss_vs_d", "no dense law: the shared-E fit had no dense table it could identify "
                                      f"({analysis.E_note or 'no dense observations'})")
    else:
        fit = FittedLaw(get_law("chinchilla"), analysis.dense_params)
        drawn.attempt(out, "dense_loss_vs_d", lambda p: plots.loss_vs_d(fit, dense, p, "dense (chinchilla, E shared)"))


def _draw_group(analysis: Analysis, up: UpcycledAnalysis, rows: pd.DataFrame | None, out: Path,
                drawn: DrawnPlots) -> Callable[[], DstarCurve] | None:
    """The group's plots; how to compute its D*(N1) curve when it has one (inside the ``dstar`` plot's attempt)."""
    slug = group_slug(up.group)
    names = {n: f"{slug}/{n}" for n in GROUP_PLOTS}
    if up.fit is None or rows is None or rows.empty:
        for name in names.values():
            drawn.skip(name, f"no upcycled law for {up.label or 'the upcycled table'}: {_why_no_fit(analysis, up)}")
        return None
    fit, title = up.fit.fitted, " ".join(x for x in ("upcycled", up.label, "(joint, E fixed)") if x)
    observed = rows[~is_predicted(rows)].reset_index(drop=True)
    drawn.attempt(out, names["loss_vs_d2"], lambda p: plots.loss_vs_d2(fit, rows, p, title))
    drawn.attempt(out, names["parity"], lambda p: plots.parity(fit, observed, p, title))
    drawn.attempt(out, names["residuals"], lambda p: plots.residuals(fit, observed, p, title))
    drawn.attempt(out, names["alpha_d1"],
                  lambda p: plots.alpha_diagnostics(alpha_d1(observed, E=analysis.E), p, title))
    if up.answer is None:
        drawn.skip(names["backtest"], "no answer to backtest: the analysis has no from-scratch and upcycled pair")
    else:
        drawn.attempt(out, names["backtest"], lambda p: plots.backtest_errors(up.answer["backtest"],
                                                                             up.answer["calibration"], p, up.label))
    if analysis.scratch is None:
        drawn.skip(names["catch_up"], f"no from-scratch MoE law to catch up: {analysis.missing('chinchilla')}")
        return None
    moe = analysis.scratch.fitted
    span = plots.token_span((moe, fit), analysis.n1s, float(rows["D2"].min()) / 10, float(rows["D2"].max()) * 1e3)
    drawn.attempt(out, names["catch_up"], lambda p: plots.catch_up_curves(moe, fit, analysis.n1s,
                                                                         _sunk_costs(up, rows), p, span, title))
    band = np.geomspace(min(analysis.n1s) / 10, max(analysis.n1s) * 10, BAND_POINTS)
    return lambda: plots.dstar_curve(moe, fit, band, up.label, (up.dstar or {}).get("closed_form"))


def with_predicted_rows(tables: Mapping[str, pd.DataFrame], curves: Mapping[str, Any]) -> dict[str, pd.DataFrame]:
    """The observed ``tables`` with the decay ends an analysis with curves predicted (its record's ``curves``
    rows, marked predicted) appended, so that its loss plots show both."""
    rows = (curves or {}).get("rows") or {}  # without their fit weights: no plot refits them
    return {k: pd.concat([df, pd.DataFrame(rows[k]).drop(columns=[WEIGHT], errors="ignore")], ignore_index=True)
            if rows.get(k) else df for k, df in tables.items()}


def draw_analysis(analysis: Analysis, tables: Mapping[str, pd.DataFrame], out_dir: Path) -> DrawnPlots:
    """Every plot of ``analysis`` (fitted on ``tables``, analyze's "dense", "scratch" and "upcycled") into
    ``out_dir``; what was drawn and, one line each, what was skipped and why. Decays it predicted from trunk curves
    are drawn hollow in the loss plots; parity, residuals and alpha(D1) are of observed decays."""
    out = Path(out_dir)
    drawn = DrawnPlots()
    tables = with_predicted_rows(tables, analysis.curves)
    upcycled = _rows(tables, "upcycled")
    by_label = {group_label(g): rows for g, rows in upcycled_groups(upcycled)} if not upcycled.empty else {}
    curves = []
    for up in analysis.upcycled:
        curve = _draw_group(analysis, up, by_label.get(up.label), out, drawn)
        if curve is not None:
            curves.append(curve)
    if curves:
        drawn.attempt(out, "dstar", lambda p: plots.dstar_band([curve() for curve in curves], p))
    else:
        drawn.skip("dstar", "no upcycling group has both a from-scratch and an upcycled law: "
                            f"{analysis.missing('chinchilla', 'joint')}")
    _draw_scratch(analysis, tables, out, drawn)
    studies = {study.label: study for study in expansion_studies(dict(tables))}
    for study in analysis.expansions:
        _draw_expansion(study, studies.get(study.label), out, drawn)
    return drawn


def _draw_expansion(study: ExpansionAnalysis, mapped: Study | None, out: Path, drawn: DrawnPlots) -> None:
    """An expansion study's plots: its expanded rows' group plots and its D*_expand over N1 (``<study>/dstar``)."""
    name = f"{as_slug(study.label)}/dstar"
    inner = study.analysis
    if inner is None or mapped is None or not inner.upcycled:
        drawn.skip(name, f"{study.label} was not analysed: " + ("; ".join(m["why"] for m in study.missing)
                                                                  or "its expanded rows are not in the tables"))
        return
    curve = _draw_group(inner, inner.upcycled[0], mapped.tables["upcycled"], out, drawn)
    if curve is None:
        drawn.skip(name, f"no D*_expand for {study.label}: {inner.missing('chinchilla', 'joint')}")
    else:
        drawn.attempt(out, name, lambda p: plots.dstar_band([curve()], p))
