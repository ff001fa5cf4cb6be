"""bench/active_design.py --quick: the JSON the issue specifies, with figures a broken criterion or cost model would
get wrong (the c-optimal design needs less of the full grid's FLOPs than picking points at random), and the
curve-aware method's parts: its curves end where the truth's decays end, and it never buys a stopped trunk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import active_design as bench  # noqa: E402  (bench/ is scripts, not a package)


@pytest.fixture(scope="module")
def sim() -> bench.Sim:
    p = bench.grid_plan()
    target = float(max(s.observation.N1 for s in p.observations()))
    truth = bench.draw_truths(1, target, np.random.default_rng(0))[0]
    return bench.Sim(p, truth, target, seed=0)


def test_simulated_curves_end_on_the_observed_decays_and_sit_above_them_at_constant_lr(sim: bench.Sim) -> None:
    curves = sim.curves
    for lay in list(curves.layout.values())[:3]:
        for d, (branch, _) in lay.decays.items():
            decay = curves.decay_curves[d]
            assert decay.loss[-1] == sim.y[d] and decay.steps[-1] == decay.lr.size
            assert decay.lr[-1] == pytest.approx(0.1) and decay.lr[decay.steps[0] - 2] == 1.0
            piece = next(sid for sid, _, end in lay.pieces if end == branch)
            assert curves.piece_curves[piece][1][-1] > decay.loss[-1]  # the decay gains, beyond the noise


def test_a_stopped_trunk_is_never_bought(sim: bench.Sim) -> None:
    state = bench.State(list(sim.pilot), bench.Fitter(), curves=True)
    sim.refit(state, set(bench.LAW))
    left = [q for q in sim.pool if q not in set(state.bought)]
    rng = np.random.default_rng(0)

    def trunk_of(pick) -> str:
        return pick.trunk if isinstance(pick, bench.Extension) else pick[0].trunk

    first = bench.choose_upscale_curves(sim, state, left, rng)
    state.stopped.add(trunk_of(first))
    live = [q for q in left if q.trunk not in state.stopped]
    again = bench.choose_upscale_curves(sim, state, live, rng)
    assert trunk_of(again) not in state.stopped
    assert not isinstance(again, bench.Extension) or again.piece not in {
        p for t in state.stopped for p, _, _ in sim.curves.layout[t].pieces}


@pytest.mark.slow  # starts bench/active_design.py as a subprocess: minutes on a 2-core machine
def test_quick_bench_writes_the_figures(tmp_path) -> None:
    out = tmp_path / "figures.json"
    run = subprocess.run([sys.executable, "-W", "ignore", str(ROOT / "bench" / "active_design.py"), "--quick",
                          "--draws", "2", "--workers", "2", "--json", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    figures = json.loads(out.read_text())
    assert figures == json.loads(run.stdout)
    methods = {"upscale", "upscale_curves", "anchor", "random", "cheapest"}
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
    assert set(figures["goals"]) == {"upscale_le_0.30", "upscale_le_0.6x_anchor", "coverage_ge_0.75",
                                     "curves_le_0.08", "curves_coverage_ge_0.75"}
    assert 0 <= figures["predicted_share"] <= 1 and figures["stopped_trunks"] >= 0
    assert 0 <= figures["stopped_flops"] <= 1
