"""bench/active_design.py --quick: the JSON the issue specifies, with figures a broken criterion or cost model would
get wrong (the c-optimal design needs less of the full grid's FLOPs than picking points at random)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # starts bench/active_design.py as a subprocess: minutes on a 2-core machine
def test_quick_bench_writes_the_figures(tmp_path) -> None:
    out = tmp_path / "figures.json"
    run = subprocess.run([sys.executable, "-W", "ignore", str(ROOT / "bench" / "active_design.py"), "--quick",
                          "--draws", "2", "--workers", "2", "--json", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    figures = json.loads(out.read_text())
    assert figures == json.loads(run.stdout)
    methods = {"upscale", "anchor", "random", "cheapest"}
    assert methods <= set(figures["fraction_of_full_flops"]) and methods <= set(figures["coverage_80"])
    assert set(figures["log10_dstar_error_at"]) == {"0.1", "0.2"}
    assert methods <= set(figures["log10_dstar_error_at"]["0.1"]) and figures["truths"] == 3
    assert figures["draws"] == 2 and all(len(v) == 2 for v in figures["coverage_80_by_draw"].values())
    for m, v in figures["coverage_80"].items():  # the pooled share is the mean of the draws' shares
        assert abs(v - sum(figures["coverage_80_by_draw"][m]) / 2) < 1e-12
        assert figures["coverage_80_se"][m] >= 0
    assert all(0 < v <= 1 for v in figures["fraction_of_full_flops"].values())
    assert all(0 <= v <= 1 for v in figures["coverage_80"].values())
    assert set(figures["coverage_80_delta"]) == set(figures["coverage_80"])  # the delta method's, for comparison
    assert figures["fraction_of_full_flops"]["upscale"] < figures["fraction_of_full_flops"]["random"]
    assert set(figures["goals"]) == {"upscale_le_0.30", "upscale_le_0.6x_anchor", "coverage_ge_0.75"}
