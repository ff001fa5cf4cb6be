"""Fit health (fitting/health.py) on fixed tables: E at its bound, an exploding interval, a rising law, a large LOO
error, each a named problem of its kind; the paper's Table 2 laws on the bundled tables have none, and every D* and
verdict of the analysis says whether it rests on an unhealthy fit (and survives JSON, old records still load)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from upscale.fitting.analysis import Analysis, analyze
from upscale.fitting.data import read_table
from upscale.fitting.health import (
    HEALTH_KINDS,
    check_bounds,
    check_dstar,
    check_fit,
    check_intervals,
    check_loo,
    check_monotone,
    concerning,
    slope,
)
from upscale.fitting.laws import get_law
from upscale.fitting.shared import SHARED_FIT, SharedE, shared_problems
from upscale.fitting.synthetic import TABLE2, bundled_path, design, generate

CHIN, JOINT = get_law("chinchilla"), get_law("joint")
WHERE = ("chinchilla", "from-scratch MoE")
UP_WHERE = ("joint", "upcycled naive")


@pytest.fixture(scope="module")
def tables() -> dict[str, pd.DataFrame]:
    return {kind: read_table(bundled_path(name)) for kind, name in
            (("dense", "dense"), ("scratch", "moe"), ("upcycled", "upcycled"))}


def _kinds(problems: list[dict]) -> list[str]:
    return [p["kind"] for p in problems]


def _report(params: dict[str, float], fixed: dict[str, float], ci: dict | None = None,
            loo: float | None = None) -> dict:
    return {"params": params, "fixed": fixed, "ci": ci or {}, "loo_rms": loo}


def test_E_at_zero_and_above_the_losses_is_a_bound_problem() -> None:
    params = {**TABLE2["dense"], "E": 5.4e-10}
    (p,) = check_bounds(CHIN, params, ["E", "A"], where=WHERE)
    assert p["kind"] == "bound" and p["why"].startswith("E=5.4e-10 is outside its plausible range [0.001, 20]")
    assert "longer runs" in p["add"] and set(p) == {"law", "fit", "why", "add", "kind"}
    high = check_bounds(CHIN, {**TABLE2["dense"], "E": 2.5}, [], where=WHERE, min_loss=2.4)
    assert _kinds(high) == ["bound"] and "above the smallest observed loss" in high[0]["why"]
    dense = check_bounds(CHIN, {**TABLE2["dense"], "A": 8.4e115, "alpha": 22.9}, ["A", "alpha"], where=WHERE)
    assert _kinds(dense) == ["bound", "bound"] and "values of D" in dense[0]["add"]
    edge = check_bounds(JOINT, {**TABLE2["upcycled"], "alpha3": 0.09999}, ["alpha3"], where=UP_WHERE)
    assert _kinds(edge) == ["bound"] and "at the edge" in edge[0]["why"]


def test_the_shared_E_warning_lands_in_the_problems(tables: dict[str, pd.DataFrame]) -> None:
    """fit_shared's warning about E (and about the from-scratch part it fits too) is a problem, not dropped."""
    warnings = ("E=5.4e-10 is outside its plausible range [0.001, 20]",
                "moe.B=2e+09 is outside its plausible range [1e-06, 1e+08]")
    shared = SharedE(5.4e-10, "; ".join(warnings[:1]), {**TABLE2["dense"], "E": 5.4e-10}, True, warnings)
    problems = shared_problems(shared, tables["dense"], tables["scratch"])
    assert {p["fit"] for p in problems} == {SHARED_FIT} and _kinds(problems) == ["bound", "bound"]
    assert problems[0]["why"].startswith(warnings[0]) and problems[1]["why"] == warnings[1]


def test_a_tiny_floor_makes_E_a_named_problem_of_the_analysis(tables: dict[str, pd.DataFrame]) -> None:
    """Losses with (almost) no floor: the joint E fit runs to 0; E_note and problems say so, and every D* and
    verdict resting on it is unhealthy."""
    chin = get_law("chinchilla")
    floorless = {k: {**TABLE2[k], "E": 1e-6} for k in ("dense", "moe")}
    grid = {"D": tuple(np.geomspace(1e8, 1e11, 4)), "N": (1.5e7, 1e8, 1e9)}
    dense = generate(chin, floorless["dense"], design(chin, grid), noise=0.002, seed=1)
    scratch = generate(chin, floorless["moe"], design(chin, grid), noise=0.002, seed=2)
    up = tables["upcycled"]
    up = up[up["D2"] >= up["D2"].median()]
    analysis = analyze({"dense": dense, "scratch": scratch, "upcycled": up}, n1s=[1e8], bootstrap=0)
    bounds = [p for p in analysis.problems if p["kind"] == "bound" and p["fit"] == SHARED_FIT]
    assert bounds and analysis.E < 1.1e-3 and "E=" in bounds[0]["why"]
    (u,) = analysis.upcycled
    assert "E=" in analysis.E_note and u.dstar is not None and u.decisions
    assert u.dstar["health"] == "unhealthy" and all(r["health"] == "unhealthy" for r in u.dstar["results"])
    assert {"law": "chinchilla", "fit": SHARED_FIT, "kind": "bound"} in u.dstar["health_problems"]
    assert all(v["health"] == "unhealthy" for v in u.decisions)


def test_an_exploding_interval_is_an_interval_problem(tables: dict[str, pd.DataFrame]) -> None:
    """The from-scratch intervals users were shown as clean numbers: B over 157 decades, beta 32 wide."""
    params = {**TABLE2["moe"], "E": 0.165}
    ci = {"A": [25.0, 40.0], "alpha": [0.15, 0.17], "B": [3.6e-05, 2.4e152], "beta": [-1.03, 31.5]}
    problems = check_intervals(CHIN, ci, where=WHERE)
    assert _kinds(problems) == ["interval", "interval"]
    assert "B [3.6e-05, 2.4e+152] spans 156.8 decades" in problems[0]["why"] and "values of N" in problems[0]["add"]
    assert "beta [-1.03, 31.5] is 32.5 wide" in problems[1]["why"]
    assert _kinds(check_intervals(CHIN, {"B": [None, 3.0], "A": [-1.0, 3.0]}, where=WHERE)) == ["interval"] * 2
    assert _kinds(check_intervals(JOINT, {"alpha3": [-0.06, 0.06]}, where=UP_WHERE)) == ["interval"]  # > box / 2
    whole = check_fit(CHIN, _report(params, {"E": 0.165}, ci), tables["scratch"], where=WHERE)
    assert _kinds(whole) == ["interval", "interval"]


def test_a_rising_law_is_a_monotone_problem(tables: dict[str, pd.DataFrame]) -> None:
    """The joint law whose effective D2 exponent alpha2 - alpha3 ln D1 turns negative above D1 ~ 9e6: the loss rises
    with D2 on the trained range and at the D* it reports."""
    rising = {**TABLE2["upcycled"], "alpha3": 0.085 / np.log(9e6)}
    d1 = np.array([1e6, 9e6 * 0.9, 9e6 * 1.1, 1e9])
    s = slope(JOINT, rising, {"D1": d1, "D2": np.full(4, 1e9), "N1": np.full(4, 1e8)}, ("D2",))
    assert list(s < 0) == [True, True, False, False]
    problems = check_monotone(JOINT, rising, tables["upcycled"], where=UP_WHERE)
    assert _kinds(problems) == ["monotone", "monotone"]  # D1 as well: alpha1 - alpha3 ln D2 < 0 there
    assert [p["why"].split(" (")[0] for p in problems] == [
        "the predicted loss does not fall with D1 on the trained range",
        "the predicted loss does not fall with D2 on the trained range"]
    assert check_monotone(JOINT, TABLE2["upcycled"], tables["upcycled"], where=UP_WHERE) == []
    at = check_dstar((CHIN, {**TABLE2["moe"], "E": 0.165}), (JOINT, rising), [{"n1": 1e8, "dstar": 1e7},
                                                                              {"n1": 1e9, "dstar": None}],
                     moe_where=WHERE, up_where=UP_WHERE)
    assert {p["kind"] for p in at} == {"monotone"} and {p["n1"] for p in at} == {1e8}
    assert "at the D* it reports (1e+07 tokens at N1=1e+08)" in at[0]["why"]
    assert check_dstar((CHIN, {**TABLE2["moe"], "E": 0.165}), (JOINT, TABLE2["upcycled"]),
                       [{"n1": 1e9, "dstar": 3e9}], moe_where=WHERE, up_where=UP_WHERE) == []
    health = concerning(at, "upcycled naive", "naive", 1e8)
    assert health["health"] == "unhealthy" and {p["kind"] for p in health["health_problems"]} == {"monotone"}
    assert concerning(at, "upcycled naive", "naive", 1e9)["health"] == "ok"  # that problem is of the D* at 1e8 only
    assert concerning(at, "upcycled drop", "drop", 1e8)["health"] == "ok"  # nor of another group


def test_a_large_loo_error_is_a_loo_problem(tables: dict[str, pd.DataFrame]) -> None:
    params = {**TABLE2["moe"], "E": 0.165}
    (p,) = check_loo(CHIN, params, tables["scratch"], 1.0, where=WHERE)
    assert p["kind"] == "loo" and p["why"].startswith("LOO RMS 1 is ") and "no single point" in p["add"]
    assert check_loo(CHIN, params, tables["scratch"], 0.01, where=WHERE) == []
    assert check_loo(CHIN, params, tables["scratch"], None, where=WHERE) == []


def test_the_paper_laws_on_the_bundled_tables_are_healthy(tables: dict[str, pd.DataFrame]) -> None:
    """Table 2's laws: no health problem, every D* and verdict "ok", and the record round-trips with its health (an
    older record without it still loads). Without a bootstrap: with one, E's own interval is a problem (below)."""
    analysis = analyze(tables, n1s=[1e8, 1e9], decisions=[(1e9, 1e9, 1e9)], bootstrap=0)
    assert [p for p in analysis.problems if p.get("kind") in HEALTH_KINDS] == []
    (u,) = analysis.upcycled
    assert u.dstar["health"] == "ok" and u.dstar["health_problems"] == []
    assert [r["health"] for r in u.dstar["results"]] == ["ok", "ok"] and u.decisions[0]["health"] == "ok"
    assert analysis.decision(1e9, 1e9, 1e9)["health"] == "ok" and "E=" not in analysis.E_note
    record = json.loads(json.dumps(analysis.to_json()))
    back = Analysis.from_json(record)
    assert back.upcycled[0].dstar == record["upcycled"][0]["dstar"] and back.upcycled[0].decisions[0]["health"] == "ok"
    for u_json in record["upcycled"]:  # as written before fit health
        for key in ("health", "health_problems"):
            u_json["dstar"].pop(key)
            for entry in (*u_json["dstar"]["results"], *u_json["decisions"]):
                entry.pop(key)
    old = Analysis.from_json(record)
    assert "health" not in old.upcycled[0].dstar and old.decision(1e9, 1e9, 1e9)["health"] == "ok"


def test_E_is_bootstrapped_jointly_and_its_uncertainty_reaches_dstar(tables: dict[str, pd.DataFrame]) -> None:
    """The bundled tables do not pin E (fitted 0.28 against the generating 0.165): E's bootstrap interval holds the
    truth, reaches the floor and is a named interval problem of the shared fit, and every later bootstrap draw
    refits with that draw's E, so the from-scratch samples carry it (E varies across them)."""
    analysis = analyze(tables, n1s=[1e9], decisions=[(1e9, 1e9, 1e9)], bootstrap=24)
    iv = analysis.E_bootstrap["intervals"]["95"]
    assert iv["low"] < 0.165 < iv["high"] and analysis.E_bootstrap["bootstrap"] == 24
    (p,) = [p for p in analysis.problems if p.get("kind") in HEALTH_KINDS]
    assert p["fit"] == SHARED_FIT and p["kind"] == "interval" and "E's 95% bootstrap interval" in p["why"]
    E_samples = analysis.scratch.fitted.samples[:, CHIN.param_names.index("E")]
    assert np.ptp(E_samples) > 0.05 and analysis.upcycled[0].dstar["results"][0]["health"] == "unhealthy"
