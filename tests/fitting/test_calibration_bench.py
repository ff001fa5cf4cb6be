"""bench/calibration.py: the truths land in their classes with the exact re-expressed laws, and a --quick run writes
the figures the issue asks for, with the far-outside case flagged."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from upscale.fitting.synthetic import TABLE2

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "calibration.py"


def _bench():
    spec = importlib.util.spec_from_file_location("calibration_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_rescaled_laws_are_the_laws_at_scaled_tokens() -> None:
    cal = _bench()
    rng = np.random.default_rng(0)
    d1, d2, n = (10 ** rng.uniform(4, 12, 20) for _ in range(3))
    for k in (1e-4, 3.0, 1e5):
        moe = cal.rescale("chinchilla", TABLE2["moe"], k)
        np.testing.assert_allclose(cal.CHIN.predict(moe, {"D": d1, "N": n}),
                                   cal.CHIN.predict(TABLE2["moe"], {"D": d1 * k, "N": n}), rtol=1e-12)
        up = cal.rescale("joint", TABLE2["upcycled"], k)
        np.testing.assert_allclose(cal.JOINT.predict(up, {"D1": d1, "D2": d2, "N1": n}),
                                   cal.JOINT.predict(TABLE2["upcycled"], {"D1": d1 * k, "D2": d2 * k, "N1": n}),
                                   rtol=1e-12)


def test_truths_land_in_their_class() -> None:
    cal = _bench()
    cases = cal.allocate(10, quick=False)
    assert {c for c, _ in cases} == set(cal.CLASSES)
    for i, (cls, scale) in enumerate(cases):
        t = cal.draw_truth(i, cls, scale, seed=1)
        lo, hi = t.token_range
        if cls == "none":
            assert t.dstar is None
            continue
        assert t.state == "crossing" and t.dstar is not None
        if cls == "inside":
            assert lo <= t.dstar <= hi
        elif cls == "near":
            assert 1 < t.factor <= 10
        else:
            assert t.factor > 10 and (t.dstar > hi) == (cls == "far-above")


@pytest.mark.slow  # starts bench/calibration.py as a subprocess: three analyses with a bootstrap
def test_quick_bench_writes_the_figures(tmp_path) -> None:
    out = tmp_path / "calibration.json"
    run = subprocess.run([sys.executable, "-W", "ignore", str(BENCH), "--quick", "--bootstrap", "10", "--workers", "2",
                          "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    figures = json.loads(out.read_text())
    assert figures["truths"] == 3 and figures["bootstrap"] == 10 and len(figures["cases"]) == 3
    assert set(figures["classes"]) == {"inside", "far-above", "far-below", "all"}
    keys = {"n", "coverage_80", "coverage_95", "missed", "false", "median_abs_log10_error", "extrapolation",
            "unhealthy", "out_of_range", "flagged", "flagged_where"}
    for f in figures["classes"].values():
        assert keys <= set(f)
        assert all(f[k] is None or 0 <= f[k] <= 1 for k in keys - {"n", "median_abs_log10_error"})
    assert set(figures["goals"]) == {"inside_coverage_80_within_5_points", "inside_coverage_95_within_5_points",
                                     "every_far_case_flagged", "every_far_case_flagged_for_where_dstar_is"}
    far = [c for c in figures["cases"] if c["class"].startswith("far")]
    assert far and all(c["flagged"] for c in far)
    assert all(c["extrapolation"] or c["out_of_range"] for c in far)  # flagged for where D* is, not only health
    inside = next(c for c in figures["cases"] if c["class"] == "inside")
    assert inside["true_state_in_range"] == "crossing" and inside["interval_80"] is not None
    assert "| inside |" in run.stdout
    again = subprocess.run([sys.executable, "-W", "ignore", str(BENCH), "--from-json", str(out)], capture_output=True,
                           text=True, timeout=120, cwd=ROOT)  # the figures again from the cases, nothing rerun
    assert again.returncode == 0, again.stderr
    assert again.stdout.split("\ngoals")[0] == run.stdout.split("\ngoals")[0]
