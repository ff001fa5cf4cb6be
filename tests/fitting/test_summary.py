"""The fit report (the `upscale fit --json` contract), grouped fits and reading a report back."""

import json

import numpy as np
import pandas as pd
import pytest

from tests.fitting.faults import failing_calls
from upscale.fitting.analysis import refit_problems
from upscale.fitting.errors import FitError
from upscale.fitting.laws import get_law
from upscale.fitting.summary import clean, grouped_report, load_fit, report
from upscale.fitting.synthetic import TABLE2, design, generate

LAW = get_law("chinchilla")
GRID = {"D": tuple(np.geomspace(1e8, 1e12, 6)), "N": tuple(np.geomspace(1e7, 1e10, 5))}


def test_report_has_the_contract_keys_and_round_trips(tmp_path):
    df = generate(LAW, TABLE2["moe"], design(LAW, GRID), noise=0.005, seed=2)
    rep, boot = report(LAW, df, {"E": 0.165}, n_boot=30, seed=4)
    assert {"law", "params", "objective", "converged", "n_points", "loo_rms", "ci"} <= set(rep)
    assert rep["converged"] is True and rep["n_points"] == 30 and set(rep["ci"]) == {"A", "alpha", "B", "beta"}
    assert rep["bootstrap"]["unit"] == "trunk" and len(rep["bootstrap"]["samples"]) == 30 - boot.n_failed
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(rep))
    back = load_fit(path)
    assert back.params == pytest.approx(rep["params"]) and back.samples.shape == (30 - boot.n_failed, 5)
    assert back.sample_params()[0]["E"] == 0.165
    assert (rep["loo_failed"], rep["loo_failed_rows"], rep["loo_note"]) == (0, [], None)
    assert rep["bootstrap_failed"] == boot.n_failed and (rep["bootstrap_note"] is None) == (boot.n_failed == 0)


def test_failed_refits_are_reported_and_the_fit_kept(monkeypatch):
    """One LOO refit and two bootstrap refits fail (injected): the report keeps every key, counts them, reports LOO
    over the rest and warns; the analysis would list both as problems."""
    df = generate(LAW, TABLE2["moe"], design(LAW, GRID), noise=0.005, seed=2)
    clean_rep, _ = report(LAW, df, {"E": 0.165}, n_boot=10, seed=4)
    failing_calls(monkeypatch, {3: "raise", 7: "none", 10 + 1: "raise"})  # draws 3 and 7, then LOO without row 2
    rep, boot = report(LAW, df, {"E": 0.165}, n_boot=10, seed=4)
    assert set(clean_rep) == set(rep) and rep["params"] == clean_rep["params"]
    assert (rep["loo_failed"], rep["loo_failed_rows"], rep["bootstrap_failed"]) == (1, [2], 2)
    assert 0 < rep["loo_rms"] != clean_rep["loo_rms"] and boot.failed == (3, 7)
    assert rep["bootstrap"]["n_failed"] == 2 and len(rep["bootstrap"]["samples"]) == 8
    assert rep["loo_note"].startswith("1 of 30 leave-one-out refits did not converge (without row 2 (D=")
    assert rep["bootstrap_note"] == "2 of 10 bootstrap refits did not converge: the intervals are over the other 8"
    assert rep["warnings"][-2:] == [rep["loo_note"], rep["bootstrap_note"]]
    json.dumps(clean(rep), allow_nan=False)
    loo, boots = refit_problems("chinchilla", "from-scratch MoE", rep)
    assert set(loo) == {"law", "fit", "why", "add"} and loo["fit"] == "from-scratch MoE"
    assert loo["why"] == f"{rep['loo_note']}; the fit depends on single points" and "no single point" in loo["add"]
    assert boots["why"].startswith("2 of 10 bootstrap refits") and "more trunks" in boots["add"]
    assert refit_problems("chinchilla", "from-scratch MoE", clean_rep) == []


def test_grouped_report_fits_each_group():
    parts = []
    for r, alpha in ((0.0, 0.16), (0.5, 0.2)):
        p = {**TABLE2["moe"], "alpha": alpha}
        parts.append(generate(LAW, p, design(LAW, GRID), noise=0.003, seed=int(10 * r)).assign(r=r, method="drop"))
    out = grouped_report(LAW, pd.concat(parts, ignore_index=True), ["method", "r"], {"E": 0.165})
    assert [g["group"] for g in out["groups"]] == [{"method": "drop", "r": 0.0}, {"method": "drop", "r": 0.5}]
    assert [g["params"]["alpha"] for g in out["groups"]] == pytest.approx([0.16, 0.2], rel=0.05)
    with pytest.raises(FitError, match="--by column\\(s\\) n_expert not in the table"):
        grouped_report(LAW, parts[0], ["n_expert"])


def test_a_group_with_an_empty_key_is_kept():
    # Observations export r empty for methods that take none (naive): those rows form a group of their own.
    naive = generate(LAW, TABLE2["moe"], design(LAW, GRID), noise=0.003, seed=1).assign(method="naive", r=np.nan)
    drop = generate(LAW, TABLE2["moe"], design(LAW, GRID), noise=0.003, seed=2).assign(method="drop", r=0.5)
    out = grouped_report(LAW, pd.concat([naive, drop], ignore_index=True), ["method", "r"], {"E": 0.165})
    assert [g["group"] for g in out["groups"]] == [{"method": "drop", "r": 0.5}, {"method": "naive", "r": None}]
    assert [g["n_points"] for g in out["groups"]] == [30, 30]


def test_load_fit_errors_say_what_to_do(tmp_path):
    with pytest.raises(FitError, match="does not exist; write one with `upscale fit --json > FILE`"):
        load_fit(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"law": "joint", "params": {"A": 1}}')
    with pytest.raises(FitError, match="lacks parameter\\(s\\) alpha1"):
        load_fit(bad)
    bad.write_text('{"groups": []}')
    with pytest.raises(FitError, match="without --by"):
        load_fit(bad)
