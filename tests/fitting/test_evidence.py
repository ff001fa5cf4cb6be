"""Predicted decay ends beside observed ones in the analysis: weighted, resampled with their trunk, and each D* says
how much of its precision rests on them (fitting/evidence.py); without curves the record is as before."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from upscale.fitting import plots
from upscale.fitting.analysis import Analysis, analyze
from upscale.fitting.analysis_plots import with_predicted_rows
from upscale.fitting.bootstrap import resampling_units
from upscale.fitting.curve_observations import (
    PREDICTED,
    SD_PRED,
    SOURCE,
    PredictedDecays,
    is_predicted,
    prediction_weight,
)
from upscale.fitting.data import read_table, validate
from upscale.fitting.evidence import dstar_evidence, variance_shares, with_predicted
from upscale.fitting.groups import upcycled_groups
from upscale.fitting.laws import POWER_D2
from upscale.fitting.summary import fitted_law
from upscale.fitting.synthetic import E_TABLE2, bundled_path

N1 = 1e9


@pytest.fixture(scope="module")
def tables() -> dict[str, pd.DataFrame]:
    """The bundled synthetic tables thinned (every other D, four of six N1) so that an analysis takes about a second."""
    out = {kind: read_table(bundled_path(name)).drop(columns="source") for kind, name in
           (("dense", "dense"), ("scratch", "moe"), ("upcycled", "upcycled"))}
    for kind in ("dense", "scratch"):
        out[kind] = out[kind][out[kind]["D"].isin(sorted(out[kind]["D"].unique())[::2])].reset_index(drop=True)
    up = out["upcycled"]
    out["upcycled"] = up[up["N1"].isin([*sorted(up["N1"].unique())[::2], up["N1"].max()])].reset_index(drop=True)
    return out


def split(tables: dict[str, pd.DataFrame], sd_pred: float) -> tuple[dict[str, pd.DataFrame], PredictedDecays]:
    """Three of the five D2 of every upcycled trunk and two D of every from-scratch trunk taken out of the observed
    tables and handed back as predicted (their true synthetic losses, with ``sd_pred``)."""
    up, moe = tables["upcycled"], tables["scratch"]
    up_pred = up["D2"].isin(sorted(up["D2"].unique())[1:4])
    moe_pred = moe["D"].isin(sorted(moe["D"].unique())[1:4:2])
    observed = {**tables, "upcycled": up[~up_pred].reset_index(drop=True),
                "scratch": moe[~moe_pred].reset_index(drop=True)}
    predicted = {k: df[m].assign(**{SOURCE: PREDICTED, SD_PRED: sd_pred}).reset_index(drop=True)
                 for k, df, m in (("upcycled", up, up_pred), ("scratch", moe, moe_pred))}
    report = {"sd": sd_pred, "n_predicted": sum(len(t) for t in predicted.values()), "n_held_out": 6,
              "pooling": "pooled"}
    return observed, PredictedDecays(predicted, {"all": report})


@pytest.fixture(scope="module")
def trusted(tables):
    """Predictions nearly as good as observations (weight ~1): D* rests mostly on them."""
    observed, curves = split(tables, 1e-4)
    return analyze(observed, n1s=[N1], bootstrap=0, curves=curves), observed


def test_a_dstar_says_how_much_of_it_rests_on_predicted_decays(trusted, tables) -> None:
    analysis, observed = trusted
    (up,) = analysis.upcycled
    (r,) = up.dstar["results"]
    ev = r["evidence"]
    assert ev["predicted"] == {"scratch": 12, "upcycled": 60} and ev["observed"] == {"scratch": 24, "upcycled": 40}
    assert 0.5 < ev["predicted_share"] < 1
    assert ev["observed_dstar"] > 0 and abs(np.log(ev["observed_dstar"] / r["dstar"])) < 1.0
    assert analysis.points == {k: len(v) for k, v in observed.items()} and up.n_points == 40
    assert analysis.curves["points"] == {"dense": 0, "scratch": 12, "upcycled": 60}
    problem = next(p for p in analysis.problems if p.get("kind") == "predicted")
    assert problem["n1"] == N1 and "rests mostly on predicted decays" in problem["why"] and "trunk" in problem["add"]
    assert r["health"] == "unhealthy" and {"law": "joint", "fit": "upcycled", "kind": "predicted"} in \
        r["health_problems"]
    rows = analysis.curves["rows"]["upcycled"]
    assert len(rows) == 60 and all(row[SOURCE] == PREDICTED and 0 < row["weight"] < 1 for row in rows)


def test_predictions_with_a_larger_error_weigh_less(trusted, tables) -> None:
    observed, curves = split(tables, 0.05)
    loose = analyze(observed, n1s=[N1], bootstrap=0, curves=curves)
    share = loose.upcycled[0].dstar["results"][0]["evidence"]["predicted_share"]
    assert 0 < share < trusted[0].upcycled[0].dstar["results"][0]["evidence"]["predicted_share"]
    assert share < 0.5 and not any(p.get("kind") == "predicted" for p in loose.problems)
    sigma = loose.curves["noise"]["point_sd"]
    assert loose.curves["rows"]["scratch"][0]["weight"] == pytest.approx(prediction_weight(sigma, 0.05))


def test_the_record_carries_the_evidence_and_old_records_load(trusted) -> None:
    analysis, _ = trusted
    record = json.loads(json.dumps(analysis.to_json()))
    back = Analysis.from_json(record)
    assert back.curves == record["curves"] and back.to_json() == analysis.to_json()
    old = {k: v for k, v in record.items() if k != "curves"}
    assert Analysis.from_json(old).curves == {} and "curves" not in Analysis.from_json(old).to_json()


def test_without_predicted_rows_nothing_rests_on_predictions(trusted, tables) -> None:
    analysis, observed = trusted
    plain = {k: v for k, v in observed.items()}
    scratch = plain["scratch"]
    rows = plain["upcycled"]
    moe = (fitted_law(analysis.scratch.report), analysis.scratch.report["fixed"], scratch)
    up = (fitted_law(analysis.upcycled[0].fit.report), analysis.upcycled[0].fit.report["fixed"], rows)
    ev = dstar_evidence(moe, up, N1)
    assert ev["predicted_share"] == 0.0 and ev["predicted"] == {"scratch": 0, "upcycled": 0}


def test_shares_sum_to_one_and_follow_the_weights() -> None:
    rng = np.random.default_rng(0)
    parts = [(rng.normal(size=3), rng.normal(size=(20, 3)), rng.uniform(0.1, 1, 20)) for _ in range(2)]
    shares = variance_shares(parts)
    assert shares.shape == (40,) and np.all(shares >= 0) and shares.sum() == pytest.approx(1.0)
    c, J, w = parts[0]
    heavier = variance_shares([(c, J, np.where(np.arange(20) == 0, 10 * w, w)), parts[1]])
    assert heavier[0] > shares[0]


def test_a_trunks_predicted_rows_are_resampled_with_its_observed_rows(tables) -> None:
    observed, curves = split(tables, 0.01)
    combined = with_predicted(observed, curves, 0.005)["upcycled"]
    _, units = resampling_units(combined)
    assert len(units) == combined["trunk"].nunique() == 20
    for rows in units:
        part = combined.iloc[rows]
        assert part["trunk"].nunique() == 1 and set(part[SOURCE]) == {"observed", PREDICTED}
    assert set(combined.loc[combined[SOURCE] == "observed", "weight"]) == {1.0}


def test_the_user_reads_what_each_dstar_rests_on(trusted) -> None:
    analysis, _ = trusted
    ev = analysis.upcycled[0].dstar["results"][0]["evidence"]
    text = repr(analysis)
    assert f"{ev['predicted_share']:.0%} of its precision rests on 72 predicted decays (held-out error 0.0%), " \
           f"{1 - ev['predicted_share']:.0%} on 64 observed; observed decays alone: D* " in text
    assert "predicted decays from trunk curves: scratch 12, upcycled 60 (weighted against point noise" in text
    assert "family all: 72 predicted, held-out error 0.01% on 6 decays, decay parameters pooled over its trunks" in text
    assert "of its precision rests on" in analysis._repr_html_()


def test_the_loss_plots_draw_predicted_decays_apart(trusted) -> None:
    analysis, observed = trusted
    rows = with_predicted_rows(observed, json.loads(json.dumps(analysis.to_json()))["curves"])["upcycled"]
    assert len(rows) == 100 and is_predicted(rows).sum() == 60 and len(upcycled_groups(rows)) == 1
    label = "predicted from its trunk's curve"
    assert label in [h.get_label() for h in plots._fit_handles("joint", rows)]
    assert label not in [h.get_label() for h in plots._fit_handles("joint", observed["upcycled"])]
    # the plots that refit the observed rows (alpha(D1)) read them as the store gives them: no weight to refuse
    assert len(validate(POWER_D2, rows[~is_predicted(rows)], 2)) == 40


def test_without_curves_the_analysis_is_the_observed_one(trusted) -> None:
    analysis, observed = trusted
    plain = analyze(observed, n1s=[N1], bootstrap=0)
    record = plain.to_json()
    assert "curves" not in record and "evidence" not in record["upcycled"][0]["dstar"]["results"][0]
    # the evidence weighs the paper's pair of laws: its observed-only D* is that pair's (the answer's D* weighs forms)
    assert analysis.upcycled[0].dstar["results"][0]["evidence"]["observed_dstar"] == \
        record["upcycled"][0]["dstar"]["results"][0]["law_dstar"]


def test_bootstrap_refits_keep_each_rows_weight(tables) -> None:
    from upscale.fitting.bootstrap import bootstrap
    from upscale.fitting.fit import fit
    from upscale.fitting.laws import get_law

    observed, curves = split(tables, 0.01)
    law = get_law("chinchilla")
    combined = with_predicted(observed, curves, 0.005)["scratch"].assign(
        loss=lambda d: np.where(is_predicted(d), d["loss"] * 1.03, d["loss"]))  # predictions 3% off
    samples = {}
    for w in (1.0, 0.01):
        df = combined.assign(weight=np.where(is_predicted(combined), w, 1.0))
        boot = bootstrap(law, df, fit(law, df, {"E": E_TABLE2}), n=8, seed=1)
        assert boot.unit == "trunk" and boot.n_failed == 0
        samples[w] = boot.samples
    # the same draws (whole trunks, predicted rows with their observed ones); the weights decide how far the 3% pulls
    truth = fit(law, observed["scratch"], {"E": E_TABLE2}).params["A"]
    names = list(boot.names)
    assert np.abs(np.log(samples[0.01][:, names.index("A")] / truth)).mean() < \
        np.abs(np.log(samples[1.0][:, names.index("A")] / truth)).mean()


def test_predicted_decays_never_widen_the_trained_range(tables) -> None:
    """A decay predicted beyond the largest observed budget is not a trained point: every D* and verdict is still
    measured against the observed range (its extrapolation flags too)."""
    moe = tables["scratch"]
    top = moe["D"] == moe["D"].max()
    observed = {**tables, "scratch": moe[~top].reset_index(drop=True)}
    curves = PredictedDecays({"scratch": moe[top].assign(**{SOURCE: PREDICTED, SD_PRED: 1e-3}).reset_index(drop=True)},
                             {"all": {"sd": 1e-3, "n_predicted": 0}})
    analysis = analyze(observed, n1s=[N1], bootstrap=0, curves=curves)
    assert analysis.curves["points"]["scratch"] == int(top.sum())
    largest = float(observed["scratch"]["D"].max())
    assert largest < float(moe["D"].max())
    assert analysis.trained["scratch"]["D"] == [float(observed["scratch"]["D"].min()), largest]
    assert analysis.scratch.report["trained"]["D"][1] == largest
    assert analysis.scratch.fitted.span("D")[1] == largest
