"""The fitting CLI: JSON contracts (in-process, typer's runner) and every bad input through the installed console
script as one line + exit 2 (real subprocesses of .venv/bin/upscale, what users and scripts run).

Strategy: small tables written per test; the subprocesses run side by side since each pays ~1 s of imports.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.fitting.faults import failing_loo_rows
from upscale.api.cli import app
from upscale.fitting.laws import get_law
from upscale.fitting.synthetic import TABLE2, design, generate

UPSCALE = str(Path(sys.executable).with_name("upscale"))


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([UPSCALE, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def invoke(*args: str, cwd: Path) -> str:
    """Run a command in-process from ``cwd``; its stdout (it must succeed)."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, list(args))
    finally:
        os.chdir(old)
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result.stdout


def run_all(calls: list[list[str]], cwd: Path) -> list[tuple[int, str, str]]:
    """Several invocations at once (each pays ~1 s of imports): (exit code, stdout, stderr) in order."""
    procs = [subprocess.Popen([UPSCALE, *a], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
             for a in calls]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append((p.returncode, stdout, stderr))
    return out


def moe_csv(tmp_path: Path) -> Path:
    law = get_law("chinchilla")
    grid = {"D": tuple(np.geomspace(1e8, 1e12, 6)), "N": tuple(np.geomspace(1e7, 1e10, 5))}
    path = tmp_path / "moe.csv"
    generate(law, TABLE2["moe"], design(law, grid), noise=0.003, seed=1).to_csv(path, index=False)
    return path


def test_laws_lists_one_law_a_line():
    out = run("laws", cwd=Path.cwd()).stdout.splitlines()
    assert len(out) == 18 and out[0].split()[0] == "chinchilla" and "L = A·D^−alpha + B·N^−beta + E" in out[0]
    assert out[-1].split()[0] == "multi-power" and "the LR of every step" in out[-1]


@pytest.mark.slow  # ~11 s on 2 busy cores (make test stays under 10 minutes)
def test_fit_dstar_decide_optimal_json_contracts(tmp_path):
    joint = get_law("joint")
    grid = {"N1": (1e8, 1e9), "D1": (1e9, 4e9, 1.6e10), "D2": (1e9, 4e9, 1.6e10, 6.4e10)}
    generate(joint, TABLE2["upcycled"], design(joint, grid), noise=0.003, seed=4).to_csv(tmp_path / "up.csv")
    moe = invoke("fit", "--law", "chinchilla", "--data", str(moe_csv(tmp_path)), "--fix", "E=0.165",
                 "--bootstrap", "20", "--json", cwd=tmp_path)
    up = invoke("fit", "--law", "joint", "--data", "up.csv", "--fix", "E=0.165", "--bootstrap", "20", "--json",
                "--plot", "plots", cwd=tmp_path)
    fit_json = json.loads(moe)
    assert {"law", "params", "objective", "converged", "n_points", "loo_rms", "ci"} <= set(fit_json)
    assert fit_json["params"]["E"] == 0.165 and fit_json["params"]["alpha"] == pytest.approx(0.161, rel=0.1)
    assert set(fit_json["ci"]) == {"A", "alpha", "B", "beta"}
    (tmp_path / "moe.json").write_text(moe)
    (tmp_path / "up.json").write_text(up)
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {f"{name}.{ext}" for ext in ("png", "pdf") for name in
                                                                 ("parity", "residuals", "loss_vs_d2", "alpha_d1")}
    common = ["--moe", "moe.json", "--upcycled", "up.json"]
    drawn = invoke("dstar", *common, "--n1", "1e9", "--n1", "7e9", "--plot", "dstar-plots", cwd=tmp_path)
    assert "plots written to dstar-plots/ (PNG and PDF): dstar, catch_up" in drawn
    for name in ("dstar", "catch_up"):
        assert (tmp_path / "dstar-plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tmp_path / "dstar-plots" / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
    ds = json.loads(invoke("dstar", *common, "--n1", "1e9", "--n1", "7e9", "--json", cwd=tmp_path))
    dec = json.loads(invoke("decide", *common, "--n1", "1e9", "--d1", "1e9", "--d2", "1e9", "--json", cwd=tmp_path))
    opt = json.loads(invoke("optimal", "--upcycled", "up.json", "--d1", "2e12", "--compute", "1e22", "--json",
                            cwd=tmp_path))
    assert set(ds) == {"results", "closed_form", "closed_form_note"}
    assert set(ds["closed_form"]) == {"a", "b", "c", "reference", "n1_range", "formula"}
    assert [r["n1"] for r in ds["results"]] == [1e9, 7e9]
    assert {"n1", "crossings", "dstar", "dstar_state", "intervals", "interval_note", "extrapolation",
            "search_range"} <= set(ds["results"][0]) and set(ds["results"][0]["intervals"]) == {"80", "95"}
    assert dec["verdict"] in ("upcycle", "scratch", "undecided") and 0 <= dec["probability_upcycle"] <= 1
    assert opt["relative_difference"] < 0.01
    assert opt["closed_form"]["d2_opt"] == pytest.approx(opt["numeric"]["d2_opt"], rel=0.01)


@pytest.mark.slow  # ~7 s on CI's 2 cores (make test stays under 10 minutes)
def test_fit_plot_on_a_small_grid_warns_and_still_fits(tmp_path):
    """Two D2 per D1 are too few for the alpha(D1) diagnostic: one warning line, the fit printed, exit 0."""
    joint = get_law("joint")
    grid = {"N1": (1e8, 1e9), "D1": (1e9, 4e9, 1.6e10), "D2": (1e9, 4e9)}
    generate(joint, TABLE2["upcycled"], design(joint, grid), noise=0.003, seed=4).to_csv(tmp_path / "up.csv")
    table, as_json = run_all([["fit", "--law", "joint", "--data", "up.csv", "--fix", "E=0.165", "--plot", p, *extra]
                              for p, extra in (("plots", []), ("json-plots", ["--json"]))], cwd=tmp_path)
    for code, _, stderr in (table, as_json):
        assert code == 0, stderr
        warnings = [line for line in stderr.splitlines() if line.startswith("warning: plot")]
        assert warnings == ["warning: plot alpha_d1 skipped: the alpha(D1) diagnostic needs at least 2 D1 values "
                            "with more than 2 points each"], stderr
    assert "alpha1" in table[1] and "plots written to plots/ (PNG and PDF): parity, residuals, loss_vs_d2" in table[1]
    assert json.loads(as_json[1])["law"] == "joint"  # stdout is the JSON alone
    for folder in ("plots", "json-plots"):
        assert {p.name for p in (tmp_path / folder).iterdir()} == {
            f"{name}.{ext}" for ext in ("png", "pdf") for name in ("parity", "residuals", "loss_vs_d2")}


def test_compare_and_grouped_fit(tmp_path):
    law = get_law("data-mul")
    truth = {"A": 20.0, "alpha1": 0.1, "alpha2": 0.3, "alpha3": 4e-3, "E": 0.5}
    grid = {"D1": tuple(np.geomspace(1e7, 1e12, 6)), "D2": tuple(np.geomspace(1e6, 1e12, 6))}
    parts = [generate(law, truth, design(law, grid), noise=0.005, seed=s).assign(r=r) for s, r in ((1, 0.0), (2, 0.5))]
    pd.concat(parts).to_csv(tmp_path / "up.csv", index=False)
    parts[0].to_csv(tmp_path / "one.csv", index=False)
    cmp = invoke("compare", "--laws", "data-mul,data-mul-noint", "--data", "one.csv", "--json", cwd=tmp_path)
    grouped = invoke("fit", "--law", "data-mul", "--data", "up.csv", "--by", "r", "--json", cwd=tmp_path)
    rows = json.loads(cmp)["results"]
    assert [r["law"] for r in rows] == ["data-mul", "data-mul-noint"]
    assert {"loo_rms", "extrapolation_rms", "aic", "bic"} <= set(rows[0]) and rows[0]["aic"] < rows[1]["aic"]
    groups = json.loads(grouped)["groups"]
    assert [g["group"] for g in groups] == [{"r": 0.0}, {"r": 0.5}]
    assert all({"params", "loo_rms", "ci"} <= set(g) for g in groups)


@pytest.mark.slow  # ~6 s on CI's 2 cores (make test stays under 10 minutes)
def test_failed_loo_refits_cost_neither_the_comparison_nor_the_fit(tmp_path, monkeypatch):
    """The user's report: one failing LOO refit made `compare` exit 2 and lose every law, and `fit` the same. With
    every LOO refit of data-add failing (injected) both commands succeed and say how many failed."""
    law = get_law("data-mul")
    truth = {"A": 20.0, "alpha1": 0.1, "alpha2": 0.3, "alpha3": 4e-3, "E": 0.5}
    grid = {"D1": tuple(np.geomspace(1e7, 1e12, 5)), "D2": tuple(np.geomspace(1e6, 1e12, 5))}
    df = generate(law, truth, design(law, grid), noise=0.005, seed=1)
    df.to_csv(tmp_path / "one.csv", index=False)
    n_add = len(get_law("data-add").param_names)
    failing_loo_rows(monkeypatch, df["loss"].to_numpy(), range(1, len(df) + 1), n_free=n_add)
    rows = json.loads(invoke("compare", "--laws", "data-mul,data-add", "--data", "one.csv", "--json",
                             cwd=tmp_path))["results"]
    assert [r["law"] for r in rows] == ["data-mul", "data-add"] and rows[0]["loo_failed"] == 0
    assert rows[1]["loo_rms"] is None and rows[1]["loo_failed"] == len(df) and "not reported" in rows[1]["loo_note"]
    fit = json.loads(invoke("fit", "--law", "data-add", "--data", "one.csv", "--json", cwd=tmp_path))
    assert fit["converged"] and fit["loo_rms"] is None and fit["loo_failed"] == len(df)
    assert fit["warnings"][-1] == fit["loo_note"]
    table = invoke("fit", "--law", "data-add", "--data", "one.csv", cwd=tmp_path)
    assert "leave-one-out refits did not converge" in " ".join(table.split())  # the caption, wrapped


def bad_tables(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    base = pd.read_csv(moe_csv(tmp_path))
    files = {}

    def write(name: str, df: pd.DataFrame) -> str:
        files[name] = tmp_path / f"{name}.csv"
        df.to_csv(files[name], index=False)
        return str(files[name])

    nan = base.copy()
    nan.loc[[2, 7], "loss"] = np.nan
    neg = base.copy()
    neg.loc[[0], "D"] = -5.0
    neg.loc[[3], "D"] = 0.0
    rng = np.random.default_rng(5)  # pure noise over six decades: no start converges (checked when written)
    noise = pd.DataFrame({"D": 10 ** rng.uniform(8, 12, 40), "N": 10 ** rng.uniform(6, 10, 40),
                          "loss": 10 ** rng.uniform(-3, 3, 40)})
    ok = write("ok", base)
    return {
        "missing column": (["--law", "chinchilla", "--data", write("nocol", base.drop(columns="N"))],
                           "law 'chinchilla' needs column(s) N"),
        "nan loss": (["--law", "chinchilla", "--data", write("nan", nan)],
                     "column 'loss' has NaN, infinite or non-numeric values in row(s) 3, 8"),
        "non-positive tokens": (["--law", "chinchilla", "--data", write("neg", neg)],
                                "column 'D' has zero or negative values in row(s) 1, 4"),
        "too few points": (["--law", "chinchilla", "--data", write("few", base.iloc[:5])],
                           "5 free parameter(s) but the table has 5 point(s); need at least 6"),
        "unknown law": (["--law", "chinchila", "--data", ok], "unknown law 'chinchila'; valid laws: chinchilla"),
        "no convergence": (["--law", "chinchilla", "--data", write("noise", noise)],
                           "did not converge from any of 8 start(s)"),
        "bad --fix": (["--law", "chinchilla", "--data", ok, "--fix", "E0.1"], "--fix 'E0.1': write NAME=VALUE"),
        "missing file": (["--law", "chinchilla", "--data", str(tmp_path / "nope.csv")], "does not exist"),
        "bad --by": (["--law", "chinchilla", "--data", ok, "--by", "method"], "--by column(s) method not in"),
    }


@pytest.mark.slow  # ~12 s on 2 busy cores (make test stays under 10 minutes)
def test_every_bad_input_is_one_line_and_exit_2(tmp_path):
    cases = bad_tables(tmp_path)
    results = run_all([["fit", *args] for args, _ in cases.values()], tmp_path)
    for (case, (_, message)), (rc, stdout, stderr) in zip(cases.items(), results, strict=True):
        lines = stderr.strip().splitlines()
        assert rc == 2, (case, stderr)
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (case, stderr)
        assert stdout == "", case  # nothing printed as if it were a result


def test_bad_fit_files_for_dstar_are_user_errors(tmp_path):
    (tmp_path / "up.json").write_text("not json")
    p = run("dstar", "--moe", "missing.json", "--upcycled", "up.json", "--n1", "1e9", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.startswith("error: fit file 'missing.json' does not exist")
