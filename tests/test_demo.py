"""`upscale demo` through the console script: the synthetic fit (fast) and the real pipeline on a tiny grid (slow).

Both run in a subprocess with their own UPSCALE_HOME, as `make demo` runs on a fresh machine. The demo records its
analysis in the store, and `upscale decide` / `upscale dstar` without fit files use it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from upscale.fitting.analysis_plots import GROUP_PLOTS

UPSCALE = Path(sys.executable).parent / "upscale"
# fitting/analysis_plots.py's names for the synthetic tables (one ungrouped upcycled table: its folder is `all`)
PLOTS = {f"{name}.{ext}" for ext in ("png", "pdf") for name in
         ("dstar", "scratch_loss_vs_d", "scratch_parity", "scratch_residuals", "dense_loss_vs_d",
          *(f"all/{n}" for n in GROUP_PLOTS))}


def _upscale(home: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "UPSCALE_HOME": str(home), "COLUMNS": "200"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([str(UPSCALE), *args], capture_output=True, text=True, env=env, timeout=timeout)


def _demo(home: Path, *args: str, timeout: int) -> str:
    out = _upscale(home, "demo", *args, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow  # four console-script runs: ~22 s on 2 cores (test_cli_output runs the synthetic demo too)
def test_synthetic_demo_recovers_the_papers_dstar_and_writes_the_plots(tmp_path: Path) -> None:
    out = _demo(tmp_path, "--synthetic", "--details", "--bootstrap", "20", "--out", str(tmp_path / "plots"),
                timeout=300)
    assert "SYNTHETIC" in out
    # The tables are generated from Table 2's parameters, whose D* at N1 = 1e9 is 3.0e9 tokens (docs/laws.md, "D*").
    row = re.search(r"│ 1e\+09\s+│ ([0-9.e+]+)", out)
    assert row is not None, out
    assert 1.5e9 < float(row.group(1)) < 6e9
    assert out.count("verdict:") == 2
    plots = tmp_path / "plots"
    assert {p.relative_to(plots).as_posix() for p in plots.rglob("*") if p.is_file()} == PLOTS
    # The demo's analysis is in the store: decide and dstar use it without fit files, naming it, and give the D*
    # the demo printed.
    decision = _upscale(tmp_path, "decide", "--n1", "1e9", "--d1", "1e9", "--d2", "1e9", "--json", timeout=120)
    assert decision.returncode == 0, decision.stderr
    stored = json.loads(decision.stdout)
    analysis_id = stored["analysis"]["id"]
    assert f"analysis {analysis_id} of sweep (none: the synthetic demo)" in decision.stderr
    assert stored["verdict"] == "upcycle" and stored["dstar"] == pytest.approx(float(row.group(1)), rel=1e-3)
    star = _upscale(tmp_path, "dstar", "--n1", "1e9", "--json", timeout=120)
    assert star.returncode == 0, star.stderr
    star = json.loads(star.stdout)
    assert star["analysis"]["id"] == analysis_id and star["results"][0]["dstar"] == pytest.approx(stored["dstar"])
    # A second demo on the same tables finds the analysis already made.
    assert f"analysis {analysis_id} recorded" in _demo(tmp_path, "--synthetic", "--bootstrap", "20", "--out",
                                                       str(tmp_path / "plots"), timeout=300)


def test_decide_without_fits_says_what_to_run(tmp_path: Path) -> None:
    for args in (("decide", "--n1", "1e9", "--d1", "1e9", "--d2", "1e9"), ("dstar", "--n1", "1e9")):
        out = _upscale(tmp_path, *args, timeout=120)
        assert out.returncode == 2 and out.stderr.startswith("error:"), out.stderr
        # in-process (no HTTP status in the line): the store's own reason, what is missing
        assert "no analysis" in out.stderr or "no sweep has finished segments" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and "POST /fits" not in out.stderr


TINY_GRID = """
name: demo-test
model: {sizes: [{n_layer: 1, d_model: 16, n_head: 2}, {n_layer: 1, d_model: 24, n_head: 2}, nano]}
moe: {experts: [4], topk: [2]}
upcycling: {methods: [naive]}
tokens: {d1: [1024, 2048], d2: [512, 1024, 2048], scratch: [1024, 2048, 4096]}  # 3: identifies its law
train: {context: 16, batch_size: 8, lr: {dense: 3.0e-3, moe: 2.0e-3}, warmup_tokens: 256}
data: {corpus: "builtin:python-stdlib", tokenizer: bytes, eval_tokens: 2048}
resources: {cpus: 1}
"""


@pytest.mark.slow
def test_demo_trains_a_grid_for_real_and_fits_it(tmp_path: Path) -> None:
    spec = tmp_path / "grid.yaml"
    spec.write_text(TINY_GRID)
    run = _upscale(tmp_path / "home", "demo", "--spec", str(spec), "--details", "--bootstrap", "20",
                   timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "upcycling method: naive" in out and out.count("verdict:") == 2
    plots = tmp_path / "home" / "demo"
    drawn = {p.relative_to(plots).as_posix() for p in plots.rglob("*") if p.is_file()}
    expected = {name.replace("all/", "naive_4x2/") for name in PLOTS}  # the group's plots in its folder
    if "warning: plot dstar skipped: D* is not finite" in run.stderr:  # a tiny real grid may have one side win:
        expected -= {"dstar.png", "dstar.pdf"}  # everywhere; the demo then says so instead of an empty band
    assert drawn == expected
    assert "upscale ui --launch, then http://127.0.0.1:5000/#/experiments/" in out  # the runs, not the landing
    # A second run reuses every segment: nothing is trained again.
    assert "0 segment(s) trained this run" in _demo(tmp_path / "home", "--spec", str(spec), "--bootstrap", "0",
                                                    timeout=600)
