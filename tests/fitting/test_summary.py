"""The fit report (the `upscale fit --json` contract), grouped fits and reading a report back."""

import json

import numpy as np
import pandas as pd
import pytest

from upscale.fitting.errors import FitError
from upscale.fitting.laws import get_law
from upscale.fitting.summary import grouped_report, load_fit, report
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
