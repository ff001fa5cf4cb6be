"""One answer per data, and runs brought from elsewhere: `upscale analyze` of a sweep, of the tables it exports
(`--export-tables`, read back with `--tables` or the three CSV options) and ``upscale.analyze`` of the same
observations give the same D* for the same settings, and every answer says its settings (`Analysis.settings`,
control/analysis_settings.py). In-process through typer's CliRunner on a real SQLite store filled as
tests/api/test_analysis.py fills it (the paper's laws at the planned coordinates, nothing trained)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

import upscale
from tests.api.test_analysis import fill
from tests.fitting.test_evidence import split
from tests.fitting.test_evidence import tables as thinned_tables  # noqa: F401  (a fixture)
from upscale.api.cli import app
from upscale.api.cli.analyze_command import fitted_tables
from upscale.api.cli.app import CommandError
from upscale.control.schemas import DEFAULT_ANALYSIS_BOOTSTRAP
from upscale.control.wiring import open_services
from upscale.fitting.analysis import analyze
from upscale.fitting.errors import FitError
from upscale.fitting.evidence import with_predicted
from upscale.orchestrator.settings import Settings, get_settings

KINDS = ("dense", "scratch", "upcycled")


@pytest.fixture
def sweep(tmp_path, mlflow_uri, monkeypatch):
    """(invoke, sweep id, home): a filled sweep in a fresh store that the CLI reads in-process."""
    home = tmp_path / "home"
    monkeypatch.setenv("UPSCALE_HOME", str(home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    get_settings.cache_clear()
    sid = fill(open_services(Settings(home=home, mlflow_tracking_uri=mlflow_uri), auth=False))
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args])

    yield invoke, sid, home
    get_settings.cache_clear()


def answers(record: dict) -> list[tuple]:
    """Every D* of a record (its state, crossings and intervals) per group and N1, and each group's answer (what the
    runs show, what the laws project): what must agree across entry points."""
    return [(u["label"], r["n1"], r["dstar"], r["dstar_state"], r["crossings"],
             json.dumps([r.get("intervals"), u.get("answer")], sort_keys=True))
            for u in record["upcycled"] for r in (u["dstar"] or {}).get("results", [])]


@pytest.mark.slow  # a stored analysis (MLflow, plots) and two more: ~25 s of CPU on 2 cores
def test_a_sweep_its_exported_tables_and_upscale_analyze_give_one_answer(sweep, tmp_path) -> None:
    """The same settings through every road give the same D* and intervals, and each record names its settings."""
    invoke, sid, home = sweep
    folder = tmp_path / "exported"
    done = invoke("analyze", sid, "--bootstrap", 2, "--export-tables", folder, "--json")
    assert done.exit_code == 0, done.output
    stored = json.loads(done.stdout)["analysis"]
    assert stored["settings"] == {"source": f"sweep {sid}", "curves": False, "predicted_rows": 0, "bootstrap": 2,
                                  "seed": 0, "n1s": stored["n1s"]}
    assert sorted(p.name for p in folder.iterdir()) == ["dense.csv", "scratch.csv", "upcycled.csv"]

    back = invoke("analyze", "--tables", folder, "--bootstrap", 2, "--json")
    assert back.exit_code == 0, back.output
    read = json.loads(back.stdout)["analysis"]
    assert answers(read) == answers(stored) and answers(stored)
    assert read["settings"] == {**stored["settings"], "source": f"tables {folder}"}

    frames = {k: upscale.load_observations(sid, kind=k, home=home) for k in KINDS}  # the notebook's road
    notebook = upscale.analyze(frames, bootstrap=2)
    assert answers(notebook.to_json()) == answers(stored)
    assert notebook.settings == {**stored["settings"], "source": f"sweep {sid} (its observation tables)"}


@pytest.mark.slow  # two stored analyses and three sets of plots: ~40 s on 2 cores
def test_the_cli_names_a_stored_analysis_made_with_other_settings_and_plots_tables(sweep, tmp_path) -> None:
    invoke, sid, _ = sweep
    first = invoke("analyze", sid, "--bootstrap", 0, "--export-tables", tmp_path / "tables")
    assert first.exit_code == 0, first.output
    assert f"settings: sweep {sid}; observed decays only; bootstrap 0, seed 0; D* at N1 " in first.stdout
    assert "used other settings" not in first.stdout  # nothing else stored yet
    other = invoke("analyze", sid, "--bootstrap", 0, "--n1", 2e4)
    assert other.exit_code == 0, other.output
    (line,) = [ln for ln in other.stdout.splitlines() if "used other settings" in ln]
    assert "(here N1 2e+04)" in line and "it gave D* naive 4x2 at N1 " in line and "(here naive 4x2 at N1 2e+04: " \
        in line
    tables = invoke("analyze", "--tables", tmp_path / "tables", "--bootstrap", 0, "--plot", tmp_path / "plots")
    assert tables.exit_code == 0, tables.output
    assert "not stored" in tables.stdout and f"plots written to {tmp_path / 'plots'}/" in tables.stdout
    assert list((tmp_path / "plots").rglob("*.png"))


@pytest.mark.slow  # three analyses at the default bootstrap: ~60 s on 2 cores
def test_the_defaults_agree_between_the_cli_and_upscale_analyze(sweep) -> None:
    """On main upscale.analyze bootstrapped 200 times where `upscale analyze` did 100: its intervals differed."""
    invoke, sid, home = sweep
    done = invoke("analyze", sid, "--json")
    assert done.exit_code == 0, done.output
    stored = json.loads(done.stdout)["analysis"]
    notebook = upscale.analyze({k: upscale.load_observations(sid, kind=k, home=home) for k in KINDS})
    assert notebook.settings["bootstrap"] == stored["settings"]["bootstrap"] == DEFAULT_ANALYSIS_BOOTSTRAP
    assert answers(notebook.to_json()) == answers(stored)


@pytest.mark.slow  # ~30 s: two analyses with curves, each with its law forms and backtests
def test_tables_carry_predicted_decays_and_read_back_to_the_same_answer(thinned_tables, tmp_path) -> None:  # noqa: F811
    """An analysis that fitted decay ends predicted from curves, exported as the tables it fitted, gives the same D*
    and answer from ``upscale.analyze``, and its settings count the predicted rows."""
    observed, curves = split(thinned_tables, 0.003)
    direct = analyze(observed, n1s=[1e9], bootstrap=2, curves=curves)
    for kind, df in fitted_tables(observed, direct.to_json()).items():
        df.to_csv(tmp_path / f"{kind}.csv", index=False)
    back = upscale.analyze({k: tmp_path / f"{k}.csv" for k in KINDS}, n1s=[1e9], bootstrap=2)
    assert answers(back.to_json()) == answers(direct.to_json())
    assert back.settings["predicted_rows"] == sum(direct.curves["points"].values()) > 0 and back.settings["curves"]


@pytest.mark.slow  # ~20 s: two analyses, each with its law forms and backtests
def test_without_curves_tables_give_the_answer_of_their_observed_rows(thinned_tables, tmp_path) -> None:  # noqa: F811
    """curves=False (`--no-curves`) leaves the rows marked predicted out: the answer of the observed rows alone."""
    observed, curves = split(thinned_tables, 0.003)
    for kind, df in with_predicted(observed, curves, 0.003).items():
        df.to_csv(tmp_path / f"{kind}.csv", index=False)
    alone = upscale.analyze({k: tmp_path / f"{k}.csv" for k in KINDS}, n1s=[1e9], bootstrap=0, curves=False)
    assert answers(alone.to_json()) == answers(analyze(observed, n1s=[1e9], bootstrap=0).to_json())
    assert alone.settings["predicted_rows"] == 0 and not alone.settings["curves"]


def test_a_missing_file_or_column_is_one_line_naming_it(tmp_path) -> None:
    runner = CliRunner()
    folder = tmp_path / "mine"
    folder.mkdir()
    pd.DataFrame({"D": [1e8, 2e8], "N": [1e7, 1e7], "loss": [3.0, 2.9]}).to_csv(folder / "dense.csv", index=False)
    pd.DataFrame({"D": [1e8, 2e8], "loss": [3.0, 2.9]}).to_csv(folder / "scratch.csv", index=False)
    missing = runner.invoke(app, ["analyze", "--tables", str(folder)])
    assert isinstance(missing.exception, CommandError) and "no upcycled.csv there" in str(missing.exception)
    pd.DataFrame({"D1": [1e8], "N1": [1e7], "loss": [2.8]}).to_csv(folder / "upcycled.csv", index=False)
    column = runner.invoke(app, ["analyze", "--tables", str(folder), "--bootstrap", "0"])
    assert isinstance(column.exception, FitError), column.output
    assert str(column.exception) == (f"{folder / 'scratch.csv'}: the scratch table needs column(s) N (it has D, "
                                     f"loss)")
    alone = runner.invoke(app, ["analyze", "--dense", str(folder / "dense.csv")])
    assert "missing --scratch, --upcycled" in str(alone.exception)
    both = runner.invoke(app, ["analyze", "abc", "--tables", str(folder)])
    assert "not both" in str(both.exception)
    assert "give a sweep id" in str(runner.invoke(app, ["analyze"]).exception)


@pytest.mark.slow  # ~11 s on 2 busy cores (make test stays under 10 minutes)
def test_the_bundled_tables_as_the_readme_analyses_them() -> None:
    """README's worked example: the three CSV options on the bundled synthetic tables, JSON out."""
    from upscale.fitting.synthetic import bundled_path

    args = ["analyze", "--dense", bundled_path("dense"), "--scratch", bundled_path("moe"), "--upcycled",
            bundled_path("upcycled"), "--n1", "1e9", "--bootstrap", "0", "--json"]
    out = CliRunner().invoke(app, [str(a) for a in args])
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)
    assert got["source"].startswith("tables dense=") and got["analysis"]["settings"]["n1s"] == [1e9]
    ((_, n1, dstar, *_),) = answers(got["analysis"])
    assert n1 == 1e9 and 1e9 < dstar < 1e11  # the paper's D* at 1e9 is ~3e9 tokens


@pytest.mark.slow  # two analyses of the tables, ~6 s each on 2 cores
def test_tables_with_expanded_rows_give_each_expansion_study_its_answer(tmp_path) -> None:
    """`--tables DIR` reads expanded.csv when there is one: the summary's block per study, and the --json record
    that reads back to the same analysis."""
    from tests.fitting.expansion_tables import expansion_tables
    from upscale.fitting.analysis import Analysis

    folder = tmp_path / "tables"
    folder.mkdir()
    tables = {**expansion_tables(), "dense": pd.DataFrame(columns=["N", "D", "loss"]),
              "upcycled": pd.DataFrame(columns=["N1", "D1", "D2", "loss"])}
    for kind, df in tables.items():
        df.to_csv(folder / f"{kind}.csv", index=False)
    runner = CliRunner()
    out = runner.invoke(app, ["analyze", "--tables", str(folder), "--bootstrap", "0", "--json"])
    assert out.exit_code == 0, out.output
    record = json.loads(out.stdout)["analysis"]
    (study,) = record["expansions"]
    assert study["label"] == "expand 4x1 -> 8x1 uniform" and study["analysis"]["upcycled"][0]["dstar"]["results"]
    assert Analysis.from_json(record).to_json() == record
    text = runner.invoke(app, ["analyze", "--tables", str(folder), "--bootstrap", "0"]).stdout
    assert "Expansion 4x1 -> 8x1 uniform:" in text and "D*_expand at N1=" in text
