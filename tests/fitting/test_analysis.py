"""The analysis on grids too small for some of its laws: what it still fits, what it says is missing and what to
add, and the verdict from the best upcycling group; the record survives JSON."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.fitting.faults import failing_loo_rows
from upscale.fitting.analysis import ANALYSIS_VERSION, Analysis, analyze
from upscale.fitting.data import read_table
from upscale.fitting.errors import FitError
from upscale.fitting.synthetic import bundled_path


@pytest.fixture(scope="module")
def tables() -> dict[str, pd.DataFrame]:
    return {kind: read_table(bundled_path(name)) for kind, name in
            (("dense", "dense"), ("scratch", "moe"), ("upcycled", "upcycled"))}


def test_one_upcycled_size_fits_the_rest_and_says_what_to_add(tables: dict[str, pd.DataFrame]) -> None:
    """Every dense and from-scratch size, but upcycled runs at one N1 only: the joint law's N1 term cannot be
    identified, so the upcycled group is not fitted, the record says why and what to add, and the from-scratch law
    is still fitted."""
    one = tables["upcycled"][tables["upcycled"]["N1"] == tables["upcycled"]["N1"].min()].assign(
        method="naive", r=None, n_expert=8, topk=2)
    analysis = analyze({**tables, "upcycled": one}, bootstrap=0)
    assert analysis.scratch is not None and analysis.scratch.params["E"] == analysis.E
    (up,) = analysis.upcycled
    assert up.label == "naive 8x2" and up.fit is None and up.dstar is None and up.decisions == []
    joint = [p for p in analysis.problems if p["law"] == "joint"]
    assert joint and "N1 takes 1 value" in joint[0]["why"] and "dense size" in joint[0]["add"]
    assert any(p["law"] == "D*" for p in analysis.problems)
    with pytest.raises(FitError, match=r"no upcycled law.*N1 takes 1 value"):
        analysis.decision(1e9, 1e9, 1e9)
    back = Analysis.from_json(json.loads(json.dumps(analysis.to_json())))
    assert back.upcycled[0].fit is None and back.problems == analysis.problems
    assert analysis.to_json()["version"] == ANALYSIS_VERSION and analysis.points["upcycled"] == len(one)


def test_no_from_scratch_runs_still_fits_upcycling(tables: dict[str, pd.DataFrame]) -> None:
    analysis = analyze({**tables, "scratch": tables["scratch"].iloc[0:0]}, bootstrap=0)
    assert analysis.scratch is None and analysis.upcycled[0].fit is not None
    assert "dense law alone" in analysis.E_note
    assert any("no from-scratch budgets" in p["why"] for p in analysis.problems)
    with pytest.raises(FitError, match="no from-scratch MoE law"):
        analysis.decision(1e9, 1e9, 1e9)


def test_the_decision_takes_the_best_group_unless_one_is_named(tables: dict[str, pd.DataFrame]) -> None:
    up = tables["upcycled"]
    worse = up.assign(method="drop", r=0.5, loss=up["loss"] * 1.02)
    analysis = analyze({**tables, "upcycled": pd.concat([up.assign(method="naive", r=None), worse])}, bootstrap=0)
    best = analysis.decision(1e9, 1e9, 1e9)
    assert best["group"] == "naive" and best["verdict"] in ("upcycle", "scratch") and best["dstar"] > 0
    named = analysis.decision(1e9, 1e9, 1e9, group="drop r=0.5")
    assert named["group"] == "drop r=0.5" and named["loss_upcycled"] > best["loss_upcycled"]
    with pytest.raises(FitError, match=r"no upcycling group 'topk'.*naive"):
        analysis.decision(1e9, 1e9, 1e9, group="topk")


def test_nothing_to_analyse_is_an_error(tables: dict[str, pd.DataFrame]) -> None:
    empty = {k: df.iloc[0:0] for k, df in tables.items()}
    with pytest.raises(FitError, match="no observations to analyse"):
        analyze(empty, bootstrap=0)


def test_failed_loo_refits_are_a_named_problem_not_a_lost_fit(tables: dict[str, pd.DataFrame], monkeypatch) -> None:
    """Three from-scratch LOO refits fail (injected): the from-scratch law is still fitted and used for D*, its LOO RMS
    is over the other refits, and the problems say how many failed and what to add."""
    scratch = tables["scratch"].dropna(subset=["loss"]).reset_index(drop=True)
    failing_loo_rows(monkeypatch, scratch["loss"].to_numpy(), [3, 5, 7])
    analysis = analyze(tables, bootstrap=0)
    assert analysis.scratch is not None and analysis.upcycled[0].dstar is not None
    rep = analysis.scratch.report
    assert (rep["loo_failed"], rep["loo_failed_rows"]) == (3, [3, 5, 7]) and rep["loo_rms"] > 0
    (problem,) = [p for p in analysis.problems if p["fit"] == "from-scratch MoE"]
    n = len(scratch)
    assert problem["law"] == "chinchilla" and problem["add"]
    assert problem["why"].startswith(f"3 of {n} leave-one-out refits did not converge (without row 3 (D=")
    assert problem["why"].endswith(f"LOO RMS is over the other {n - 3}; the fit depends on single points")
    assert all(u.fit.report["loo_failed"] == 0 for u in analysis.upcycled)
    back = Analysis.from_json(json.loads(json.dumps(analysis.to_json())))
    assert back.problems == analysis.problems and back.scratch.report["loo_failed_rows"] == [3, 5, 7]
