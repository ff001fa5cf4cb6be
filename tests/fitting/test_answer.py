"""The answer beyond one law (fitting/answer.py and the modules under it): the runs first, law forms weighed by
backtests, bands calibrated for distance, no law used where it turns."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from upscale.fitting.analysis import Analysis, analyze
from upscale.fitting.answer import EXPANSION, _band_interval, _open_note, answer_group, merge_answer
from upscale.fitting.bands import Calibration, _conformal, form_weights
from upscale.fitting.display import summary_lines
from upscale.fitting.forms import form, turned
from upscale.fitting.observed import noise, observe
from upscale.fitting.projection import first_dstar

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import real_answer

JOINT = {"A": 300.0, "alpha1": 0.2, "alpha2": 0.25, "alpha3": 0.012, "B": 40.0, "beta": 0.3, "E": 1.7}


def export_tables(name: str) -> dict[str, pd.DataFrame]:
    return real_answer.export_tables(real_answer.DATA / name)


def dense(scratch: pd.DataFrame) -> pd.DataFrame:
    """Dense runs beside a from-scratch table: the same grid, a higher loss."""
    return scratch.assign(loss=scratch["loss"] * 1.08, trunk=scratch["trunk"] + "-dense")


@pytest.fixture(scope="module")
def inside() -> Analysis:
    return analyze(export_tables("inside_any_branch.json"), bootstrap=0)


def test_the_saturating_form_is_eq12_below_its_turns_and_never_rises_past_them() -> None:
    joint, sat = form("upcycled", "joint"), form("upcycled", "joint-saturating")
    row = np.array([[JOINT[n] for n in joint.law.param_names]])
    turn = math.exp(JOINT["alpha1"] / JOINT["alpha3"])  # 1.8e7: the D1 exponent reaches zero at D2 there
    below = {"D1": np.array([1e6, 1e7]), "D2": np.array([1e6, 1e7]), "N1": np.array([1e8, 1e8])}
    assert np.allclose(joint.log_losses(row, below), sat.log_losses(row, below))
    tokens = np.geomspace(turn / 100, turn * 100, 50)
    assert turned(joint, row, 1e8, tokens).any()  # Eq. 12 turns inside this range ...
    assert not turned(sat, row, 1e8, tokens).any()  # ... its saturating reading never does


def test_a_law_that_turns_past_the_data_is_not_used_there() -> None:
    """Runs drawn from Eq. 12 whose effective D2 exponent turns ~5x past the largest budget: the paper's pair of
    laws stops where its loss starts rising (a monotone problem names where), and D* comes from forms that hold."""
    rng = np.random.default_rng(0)
    budgets = [1e8, 4e8, 1.6e9, 6.4e9]
    sizes = [1e8, 3e8, 1e9]
    p = {**JOINT, "alpha1": 0.3, "alpha2": 0.2, "alpha3": 0.2 / math.log(3.2e10)}  # D2's exponent is 0 at D1 = 3.2e10
    rows = [{"D1": d1, "D2": d2, "N1": n, "trunk": f"u{n:g}-{d1:g}"} for n in sizes for d1 in budgets for d2 in budgets]
    up = pd.DataFrame(rows)
    lu = (p["A"] * up.D1 ** -p["alpha1"] * up.D2 ** (-p["alpha2"] + p["alpha3"] * np.log(up.D1))
          + p["B"] * up.N1 ** -p["beta"] + p["E"])
    up["loss"] = lu * np.exp(rng.normal(0, 0.002, len(up)))
    sc = pd.DataFrame([{"D": d, "N": n, "trunk": f"s{n:g}"} for n in sizes for d in budgets])
    sc["loss"] = (420 * sc.D ** -0.23 + 40 * sc.N ** -0.3 + 1.7) * np.exp(rng.normal(0, 0.002, len(sc)))
    analysis = analyze({"dense": dense(sc), "scratch": sc, "upcycled": up}, n1s=[1e9], bootstrap=0)
    (r,) = analysis.upcycled[0].dstar["results"]
    paper = next(f for f in r["answer"]["forms"] if (f["scratch"], f["upcycled"]) == ("chinchilla", "joint"))
    assert paper["stopped_at"] is not None and 6.4e9 < paper["stopped_at"] < 3.2e11
    turned_problems = [q for q in analysis.problems if q.get("kind") == "monotone" and "not used there" in q["why"]]
    assert turned_problems and turned_problems[0]["n1"] == 1e9
    saturating = next(f for f in r["answer"]["forms"] if f["upcycled"] == "joint-saturating"
                      and f["scratch"] == "chinchilla")
    assert saturating["stopped_at"] is None  # the saturating reading goes on where Eq. 12 stopped


def test_an_observed_comparison_the_fit_contradicts_is_flagged_and_the_runs_answer() -> None:
    """The moved-up real grid: at N1 = 131k and D1 = D2 = 4.19e6 the two runs have upcycling ahead by 4.3%, beyond
    the noise, where the paper's laws say scratch. The verdict there is the runs' and says the law contradicts them."""
    analysis = analyze(export_tables("inside_any_branch.json"), n1s=[131392.0],
                       decisions=[(131392.0, 4194304.0, 4194304.0)], bootstrap=0)
    (verdict,) = analysis.upcycled[0].decisions
    assert verdict["observed"]["leader"] == "upcycle" and verdict["observed"]["log_gap"] > verdict["observed"]["noise"]
    assert verdict["verdict"] == "upcycle"
    if verdict.get("law_verdict"):  # the law said otherwise: flagged, and the runs' answer stood
        assert verdict["law_verdict"] != "upcycle" and "the law contradicts the runs" in verdict["contradiction"]
    (r,) = analysis.upcycled[0].dstar["results"]
    assert r["answer"]["observed_bracket"]["low"] == 4194304.0  # upcycling ahead beyond noise at the top budget
    assert r["intervals"]["80"]["low"] >= 4194304.0  # so no interval reaches below it


def test_the_moved_up_grid_interval_holds_the_measured_tie(inside: Analysis) -> None:
    """bench/data/beyond_probe.json measured upcycled and from scratch tied at 1.68e7 tokens at N1 = 131k (and
    nearly at 32.9k): the old interval, [3.1e6, 4.1e6], excluded it; the 80% interval reaches it now."""
    for r in inside.upcycled[0].dstar["results"]:
        iv = r["intervals"]["80"]
        assert iv["low"] is not None and iv["low"] <= 1.68e7
        assert iv["high_open"] or iv["high"] >= 1.68e7, (r["n1"], iv)


def test_the_answer_survives_json_and_the_decision_endpoint_answers_the_same(inside: Analysis) -> None:
    back = Analysis.from_json(json.loads(json.dumps(inside.to_json())))
    n1 = inside.n1s[-1]
    direct = inside.upcycled[0].dstar["results"][-1]
    d = back.decision(n1, 4194304.0, 4194304.0)
    assert d["dstar_intervals"] == direct["intervals"] and d["dstar"] == direct["dstar"]
    assert d["verdict"] == "upcycle"  # the runs at that point


def test_the_summary_leads_with_the_runs_and_says_how_far_d_star_is_projected(inside: Analysis) -> None:
    text = repr(inside)
    summary = text.split("\n\n")[0].splitlines()
    assert len(summary) <= 12
    assert summary[1].lstrip().startswith("the runs")
    assert any("beyond the budgets trained" in line or "the runs bound D*" in line for line in summary)
    assert any(line.lstrip().startswith("backtest: fitted below") for line in summary)
    assert any(line.lstrip().startswith("next: upcycled at N1=") for line in summary)
    assert summary[-1].lstrip().startswith("problems:")


def test_a_grid_too_small_to_backtest_still_answers_and_says_so() -> None:
    """Two budgets and two sizes: holding either largest out leaves one, so no backtest runs (nor is the joint law
    identified: its parameters come as typed in). The answer still comes, says why there is no backtest, and that
    its intervals do not cover law-form error."""
    rng = np.random.default_rng(1)
    sizes, budgets = [1e8, 1e9], [1e9, 4e9]
    up = pd.DataFrame([{"D1": a, "D2": b, "N1": n, "trunk": f"u{n:g}{a:g}"} for n in sizes for a in budgets
                       for b in budgets])
    p = JOINT
    up["loss"] = (p["A"] * up.D1 ** -p["alpha1"] * up.D2 ** (-p["alpha2"] + p["alpha3"] * np.log(up.D1))
                  + p["B"] * up.N1 ** -p["beta"] + p["E"]) * np.exp(rng.normal(0, 0.002, len(up)))
    sc = pd.DataFrame([{"D": d, "N": n, "trunk": f"s{n:g}"} for n in sizes for d in budgets])
    sc["loss"] = 420 * sc.D ** -0.23 + 40 * sc.N ** -0.3 + 1.7
    primary = {"scratch": ({"A": 420.0, "alpha": 0.23, "B": 40.0, "beta": 0.3, "E": 1.7}, None),
               "upcycled": (JOINT, None)}
    group, (answer,) = answer_group({"scratch": sc, "upcycled": up}, [1e9], (1e7, 4e11), primary, 1.7, None, 0, 0)
    record = group.to_json()
    assert not record["backtest"]["ran"] and "not law-form error" in record["backtest"]["note"]
    assert "one value of D" in record["backtest"]["note"]
    assert not record["calibration"]["calibrated"]
    assert set(answer["intervals"]) == {"80", "95"}  # still an answer, from the in-range scatter's bands alone
    lines = summary_lines({"points": {}, "bootstrap": 0, "problems": [],
                           "upcycled": [{"label": "", "answer": record,
                                         "dstar": {"results": [{"n1": 1e9, "search_range": [1e7, 4e11],
                                                                **_merged(answer)}]}, "decisions": []}]})
    assert any("backtest: no backtest could be run" in line for line in lines)


def _merged(answer: dict) -> dict:
    out = {"dstar": None, "dstar_state": "crossing", "intervals": None, "interval_note": ""}
    merge_answer(out, answer)
    return out


def test_first_dstar_is_where_a_lead_turns_into_a_deficit() -> None:
    tokens = np.geomspace(1e6, 1e10, 5)
    gap = np.array([[-0.1, 0.2, 0.1, -0.1, -0.2],  # a deficit far below, then a lead that ends between 1e8 and 1e9
                    [0.1, 0.1, 0.1, 0.1, 0.1],  # a lead to the end: D* above the range
                    [-0.1, -0.1, -0.1, -0.1, -0.1]]).T  # never a lead: D* below it
    valid = np.ones_like(gap, dtype=bool)
    out = first_dstar(gap, valid, tokens)
    assert 1e8 < out[0] < 1e9 and math.isinf(out[1]) and out[2] == 0.0
    valid[3:, 0] = False  # the form turns before the crossing: the lead lasts as far as the form holds
    valid[:, 2] = False
    out = first_dstar(gap, valid, tokens)
    assert math.isinf(out[0]) and math.isnan(out[2])


def test_the_bands_never_end_d_star_where_the_runs_show_upcycling_ahead() -> None:
    """A trail the bands see far below the data (where an upcycled law blows up) bounds nothing when there is no lead
    before it; at or below a budget where the runs show upcycling ahead beyond noise it bounds nothing either."""
    tokens = np.geomspace(1e3, 1e7, 9)
    gap = np.array([-0.3, -0.2, -0.05, 0.01, 0.0, -0.01, -0.02, -0.04, -0.06])  # never a lead beyond the margin
    margin, valid = np.full(9, 0.03), np.ones(9, dtype=bool)
    assert _band_interval(gap, margin, valid, tokens) == (None, tokens[0])  # the blow-up read as an upper end
    assert _band_interval(gap, margin, valid, tokens, led=tokens[4]) == (None, tokens[7])
    assert _band_interval(gap, margin, valid, tokens, led=tokens[7]) == (None, tokens[8])


def test_the_95_interval_is_cut_only_where_a_pair_differs_by_three_noise_sds() -> None:
    """A diagonal pair 2.5 SDs (of a pair's difference) behind bounds D* for the 80% interval, not for the 95% one."""
    sd = 0.01
    threshold = math.sqrt(2) * sd
    scratch = pd.DataFrame({"N": 1e5, "D": [1e4, 4e4, 1.6e5], "loss": [3.0, 2.8, 2.6]})
    gaps = [3 * threshold, 0.0, -2.5 * threshold]  # log(scratch) - log(upcycled): ahead, tied, behind
    upcycled = pd.DataFrame({"N1": 1e5, "D1": scratch["D"], "D2": scratch["D"],
                             "loss": scratch["loss"] * np.exp(-np.array(gaps))})
    obs = observe(scratch, upcycled)
    obs = type(obs)(obs.pairs, {**obs.noise, "sd": sd}, obs.brackets)  # too few budgets to measure: set it
    at_2, at_3 = obs.bracket(1e5, 2.0), obs.bracket(1e5, 3.0)
    assert (at_2["low"], at_2["high"]) == (1e4, 1.6e5) and (at_3["low"], at_3["high"]) == (1e4, None)


def test_noise_is_measured_without_a_law_and_brackets_follow_it() -> None:
    rng = np.random.default_rng(3)
    budgets = 2.0 ** np.arange(16, 24)
    sc = pd.DataFrame([{"D": d, "N": n} for n in (1e5, 2e5) for d in budgets])
    sc["loss"] = (5 * sc.D ** -0.2 + 1) * np.exp(rng.normal(0, 0.01, len(sc)))
    up = pd.DataFrame([{"D1": d, "D2": d2, "N1": n} for n in (1e5, 2e5) for d in budgets for d2 in budgets])
    up["loss"] = (4 * up.D1 ** -0.05 * up.D2 ** -0.2 + 1) * np.exp(rng.normal(0, 0.01, len(up)))
    measured = noise(sc, up)["sd"]
    assert 0.007 < measured < 0.014  # the 1% scatter, not the curves' shape
    obs = observe(sc, up)
    b = obs.bracket(1e5)
    assert b is not None and len(b["budgets"]) == len(budgets)
    for p in obs.pairs:
        assert p["leader"] == ("upcycle" if p["log_gap"] > obs.noise["gap_threshold"] else
                               "scratch" if p["log_gap"] < -obs.noise["gap_threshold"] else "tie")


def test_weights_go_to_the_form_that_predicted_held_out_runs_and_conformal_needs_enough_scores() -> None:
    rows = [{"holdout": "budget", "arm": "upcycled", "form": f, "size": 1.0, "tokens": float(t), "observed": 1.0,
             "log_error": e * (1 + t / 10), "distance": 0.6} for t in range(10)
            for f, e in (("joint", 0.05), ("joint-additive", 0.005))]
    w = form_weights(pd.DataFrame(rows), "upcycled", ["joint", "joint-additive"])
    assert w["joint-additive"] > 0.9 and math.isclose(sum(w.values()), 1.0)
    scores = np.linspace(0.1, 1.0, 10)
    assert math.isinf(_conformal(scores, 0.95))  # 10 scores cannot give a 95% quantile
    assert _conformal(scores, 0.8) == pytest.approx(0.9)


def test_a_band_for_the_mean_loss_leaves_out_the_runs_point_noise() -> None:
    """Held-out residuals carry each run's point noise; D* is where the mean losses cross, so the band is for the
    mean: the noise comes out of the scale in quadrature, down to a floor, never below it."""
    cal = Calibration(weights={}, sigma0={"scratch": 0.005}, growth={"scratch": 0.02}, quantiles={"80": 1.3},
                      n_scores=40, calibrated=True)
    one_run = cal.half_width("scratch", 1.0, 0.8)
    assert one_run == pytest.approx(1.3 * math.hypot(0.005, 0.02))
    assert cal.half_width("scratch", 1.0, 0.8, noise=0.004) == pytest.approx(1.3 * math.sqrt(0.005**2 + 0.02**2
                                                                                             - 0.004**2))
    assert 0 < cal.half_width("scratch", 0.0, 0.8, noise=0.01) < cal.half_width("scratch", 0.0, 0.8)


def test_a_cross_family_table_the_old_interval_missed_is_covered() -> None:
    """tests/data/cross_family: runs from a law family upscale does not fit, true D* = 3.0e5 at N1 = 131,392 (inside
    the grid). The paper's pair of laws alone (the interval every answer had before the law forms) misses it at 80%;
    the answer's 80% interval holds it."""
    folder = Path(__file__).resolve().parents[1] / "data" / "cross_family"
    tables = {k: pd.read_csv(folder / f"{k}.csv") for k in ("dense", "scratch", "upcycled")}
    (r,) = analyze(tables, n1s=[131392.0], bootstrap=20, seed=1822367986).upcycled[0].dstar["results"]
    truth = 3.0e5

    def holds(iv: dict) -> bool:
        return (iv["low_open"] or iv["low"] <= truth) and (iv["high_open"] or truth <= iv["high"])

    assert not holds(r["parameter_intervals"]["80"]), r["parameter_intervals"]
    assert holds(r["intervals"]["80"]) and holds(r["intervals"]["95"]), r["intervals"]


def test_an_open_end_names_the_runs_that_would_close_it_in_the_arms_words() -> None:
    """Beyond the runs' lead at a size the grid has; at a size it lacks (a decision elsewhere), beyond the largest
    budget trained, never the bottom of the range searched."""
    above = {"low": 5e5, "high": None, "low_open": False, "high_open": True}
    span = (614.0, 4.9e7)
    at_grid = _open_note(above, 1.31e5, span, span[1], {"low": 1.2e5, "high": None}, EXPANSION, 2.46e5)
    elsewhere = _open_note(above, 1e5, span, span[1], None, EXPANSION, 2.46e5)
    assert "expanded (D1 = D2 = D) and from-scratch runs at N1=1.31e+05 beyond 1.2e+05 tokens" in at_grid
    assert "beyond 2.46e+05 tokens would close it" in elsewhere and "upcycl" not in elsewhere + at_grid
