"""`import upscale` as a notebook uses it, on the bundled SYNTHETIC tables: the same numbers as the CLI.

Fits are bootstrapped a little (20 refits) so that intervals and the verdict's probability exist; the CLI runs as
the installed console script in a subprocess, as a user runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pandas as pd
import pytest

import upscale
from upscale.fitting.synthetic import bundled_path
from upscale.orchestrator.errors import NotFoundError

UPSCALE = str(Path(sys.executable).with_name("upscale"))
SYNTHETIC = {"dense": bundled_path("dense"), "scratch": bundled_path("moe"), "upcycled": bundled_path("upcycled")}


@pytest.fixture(scope="module")
def fits() -> tuple[upscale.LawFit, upscale.LawFit]:
    moe = upscale.fit("chinchilla", bundled_path("moe"), fixed={"E": 0.165}, bootstrap=20)
    up = upscale.fit("joint", upscale.read_observations(bundled_path("upcycled")), fixed={"E": 0.165}, bootstrap=20)
    return moe, up


def test_import_upscale_is_light_and_exposes_the_api() -> None:
    code = ("import sys, upscale; print(sorted(m for m in ('torch', 'ray', 'mlflow', 'deepspeed', 'pandas', 'scipy', "
            "'numpy', 'httpx', 'sqlalchemy') if m in sys.modules)); print(upscale.__version__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    loaded, version = out.stdout.split("\n")[:2]
    assert loaded == "[]" and version
    lazy = [n for n in upscale.__all__ if n != "Client" or (Path(upscale.__file__).parent / "client.py").exists()]
    assert all(getattr(upscale, n) is not None for n in lazy)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        upscale.nope  # noqa: B018


def test_fit_dstar_and_decide_match_the_cli(tmp_path: Path, fits) -> None:
    moe, up = fits
    assert moe.params["E"] == 0.165 and set(up.report["ci"]) == {"A", "alpha1", "alpha2", "alpha3", "B", "beta"}
    star = upscale.dstar(moe, up, 1e9)["results"][0]
    assert 1.5e9 < star["dstar"] < 6e9  # Table 2's D* at N1 = 1e9 is ~3e9 tokens
    for name, f in (("moe.json", moe), ("up.json", up)):
        (tmp_path / name).write_text(json.dumps(f.report))
    cli = subprocess.run([UPSCALE, "dstar", "--moe", "moe.json", "--upcycled", "up.json", "--n1", "1e9", "--json"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert cli.returncode == 0, cli.stderr
    (from_cli,) = json.loads(cli.stdout)["results"]
    assert from_cli["dstar"] == pytest.approx(star["dstar"], rel=1e-9)
    for level in ("80", "95"):
        assert [from_cli["intervals"][level][k] for k in ("low", "high")] == pytest.approx(
            [star["intervals"][level][k] for k in ("low", "high")], rel=1e-9)
    # a fit file's path is taken as well as a LawFit
    assert upscale.dstar(tmp_path / "moe.json", up, [1e9])["results"][0]["dstar"] == pytest.approx(star["dstar"])
    d = upscale.decide(moe, up, n1=1e9, d1=1e9, d2=1e9)
    assert d.verdict in ("upcycle", "scratch", "undecided") and 0.0 <= d.probability_upcycle <= 1.0
    assert d.verdict == ("upcycle" if d.probability_upcycle >= 0.8 else "scratch" if d.probability_upcycle <= 0.2
                         else "undecided")


def test_analyze_gives_dstar_per_upcycling_method() -> None:
    tables = {k: upscale.read_observations(p) for k, p in SYNTHETIC.items()}
    naive = tables["upcycled"].assign(method="naive", r=None)
    drop = tables["upcycled"].assign(method="drop", r=0.5, loss=tables["upcycled"]["loss"] * 1.01)
    tables["upcycled"] = pd.concat([naive, drop], ignore_index=True)
    stages: list[tuple[str, int, int]] = []
    analysis = upscale.analyze(tables, n1s=[1e9, 7e9], bootstrap=10, progress=lambda *s: stages.append(s))
    assert [u.label for u in analysis.upcycled] == ["drop r=0.5", "naive"]
    for u in analysis.upcycled:
        assert [r["n1"] for r in u.dstar["results"]] == [1e9, 7e9] and u.fit.params["E"] == analysis.E
        assert len(u.decisions) == 2  # the grid's smallest and biggest cases, by default
    worse, plain = (u.dstar["results"][0]["dstar"] for u in analysis.upcycled)
    assert worse < plain  # a 1% worse upcycled loss is caught up with sooner
    steps = 10 + len(naive)  # the bootstrap's refits and one LOO refit a row: every stage reaches its total
    assert ("LOO, bootstrap (upcycled naive)", steps, steps) in stages and stages[0][0].startswith("shared E")
    last = {name: (done, total) for name, done, total in stages}
    assert all(done == total for done, total in last.values()), last
    back = upscale.Analysis.from_json(json.loads(json.dumps(analysis.to_json())))
    assert back.upcycled[1].fit.params == analysis.upcycled[1].fit.params and back.E == analysis.E
    # upscale.dstar crosses the paper's pair of laws: the analysis keeps that D* beside its answer's
    law = analysis.upcycled[1].dstar["results"][0]["law_dstar"]
    assert upscale.dstar(back.scratch, back.upcycled[1].fit, 1e9)["results"][0]["dstar"] == pytest.approx(law)


def test_load_observations_names_its_sweep_and_asks_for_one_among_several(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="run `upscale demo`"):
        upscale.load_observations(home=tmp_path)
    from upscale.orchestrator.settings import Settings
    from upscale.orchestrator.store import Store
    from upscale.sweeps.loader import load_spec
    from upscale.sweeps.planner import plan

    spec = load_spec(Path(str(files("upscale.sweeps") / "examples" / "demo.yaml")))
    store = Store(Settings(home=tmp_path).db_url)
    older = store.create_sweep("older", spec.model_dump(mode="json"), spec.resources.model_dump(mode="json"), [])
    df = upscale.load_observations(home=tmp_path, kind="upcycled")  # the store's only sweep
    assert df.attrs == {"sweep_id": older.id, "sweep_name": "older"}
    newest = store.create_sweep(spec.name, spec.model_dump(mode="json"), spec.resources.model_dump(mode="json"),
                                plan(spec).segments)
    with pytest.raises(ValueError, match=f"holds 2 sweeps: pass sweep_id= one of them .newest first: {newest.id}"):
        upscale.load_observations(home=tmp_path)  # never silently the newest of several
    df = upscale.load_observations(newest.id, home=tmp_path, kind="upcycled")
    assert df.empty and {"D1", "D2", "N1", "loss", "trunk", "method", "r"} <= set(df.columns)  # nothing trained yet
    assert df.attrs["sweep_id"] == newest.id
    with pytest.raises(NotFoundError):
        upscale.load_observations("no-such-sweep", home=tmp_path)


def test_fits_analyses_and_verdicts_print_a_short_summary(fits) -> None:
    """A notebook shows a summary, not the 40 KB record: parameters with intervals, D*, the verdict, problems."""
    moe, up = fits
    text = repr(moe)
    assert text.startswith("chinchilla fit on 66 points") and "E           0.165  (fixed)" in text
    assert f"A           {moe.params['A']:.4g}  95% [{moe.report['ci']['A'][0]:.4g}" in text
    assert "samples" not in text and len(text) < 1000
    html = moe._repr_html_()
    assert html.count("<tr>") == 1 + len(moe.params) and "healthy: no problem found" in html
    assert repr(upscale.decide(moe, up, n1=1e9, d1=1e9, d2=1e9)).startswith("N1=1e+09, D1=1e+09, D2=1e+09: ")
    tables = {k: upscale.read_observations(p) for k, p in SYNTHETIC.items()}
    tables["dense"] = tables["dense"][tables["dense"]["D"] < 1e10]  # E driven down: an unhealthy fit to report
    analysis = upscale.analyze(tables, n1s=[1e9], decisions=[(1e9, 1e9, 1e9)], bootstrap=10)
    text = repr(analysis)
    assert len(text) < 5000 and "D* (tokens) at N1=1e+09: " in text and "80% [" in text and "95% [" in text
    assert analysis.problems and f"{len(analysis.problems)} problem(s):" in text
    assert all(p["why"] in text for p in analysis.problems)
    html = analysis._repr_html_()
    assert "<table>" in html and html.count("<li>") == len(analysis.problems)
