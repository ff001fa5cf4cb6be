"""bench/cross_family.py: each family's truth crosses where it was placed, its runs carry point noise and trunk effects,
the coverage arithmetic counts an open end as unbounded, tests/data/cross_family/ is still the bench's case (the one
whose truth the intervals missed before the law-form change (docs/laws.md, "The answer beyond one law")), the analysis's
intervals reach the score, and a run's JSON gives its figures back."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import cross_family as bench  # noqa: E402  (bench/ is scripts, not a package)

FIXED = ROOT / "tests" / "data" / "cross_family"


@pytest.mark.parametrize("family", bench.FAMILIES)
def test_each_family_crosses_where_it_was_placed(family: str) -> None:
    for i, placement in enumerate(bench.PLACEMENTS):
        case = bench.draw_case(i, family, placement, seed=3)
        target = placement * bench.D_MAX
        assert case.dstar == pytest.approx(target, rel=1e-6)
        p, n1 = case.params, np.array([bench.N1_REF])
        scratch = bench.arm_loss(p, "s", np.array([target]), n1)[0]
        upcycled = bench.upcycled_loss(p, family, np.array([target]), np.array([target]), n1)[0]
        assert upcycled == pytest.approx(scratch, rel=1e-9)  # equal losses at D1 = D2 = D*
        below, above = bench.gap(p, family, np.array([target / 1.01, target * 1.01]))
        assert below > 0 > above  # upcycling wins just below, from scratch just above
        g = bench.gap(p, family, np.geomspace(bench.SPAN[0], target / 1.01, 5000))
        assert not np.any((g[:-1] > 0) & (g[1:] <= 0))  # and upcycling stops winning nowhere before


def _residuals(case: bench.Case) -> pd.DataFrame:
    """The upcycled table with its log ratio to the truth."""
    t = bench.tables(case)["upcycled"]
    return t.assign(r=np.log(t["loss"] / bench.TruthLaw(case.family, "upcycled").predict(case.params, t)))


def test_runs_carry_point_noise_and_trunk_effects() -> None:
    case = bench.draw_case(0, "effective", 1.0, seed=0)
    assert case.noise in bench.NOISES and case.trunk_noise in bench.NOISES
    trunk_only = _residuals(replace(case, noise=0.0, trunk_noise=0.01))
    assert (trunk_only.groupby("trunk")["r"].agg(np.ptp) < 1e-12).all()  # one offset for every branch of a trunk
    offsets = trunk_only.groupby("trunk")["r"].first()
    assert len(offsets) == 12 and offsets.nunique() == 12 and 0.004 < offsets.std() < 0.02
    point_only = _residuals(replace(case, noise=0.01, trunk_noise=0.0))
    assert (point_only.groupby("trunk")["r"].agg(np.ptp) > 0).all()
    assert 0.006 < point_only["r"].std() < 0.015
    both = _residuals(case)
    assert both["r"].abs().max() > 0 and both["r"].abs().max() < 5 * (case.noise + case.trunk_noise)


def _record(low: float | None, high: float | None) -> dict:
    """A D* result as the analysis's record writes it, with the same interval at 80% and 95%."""
    iv = {"low": low, "high": high, "low_open": low is None, "high_open": high is None}
    return {"dstar": 2e5, "dstar_state": "crossing", "intervals": {"80": iv, "95": iv}}


def test_coverage_counts_open_ends_as_unbounded() -> None:
    case = bench.draw_case(0, "curved", 0.3, seed=0)  # true D* 3e5, in the grid
    assert case.in_grid
    open_high = bench.score(case, _record(1e5, None))
    open_low = bench.score(case, _record(None, 4e5))
    missed = bench.score(case, _record(1e4, 1e5))
    wide = bench.score(case, _record(1e4, 1e6))
    none = bench.score(case, None)
    assert open_high["covered_80"] and not open_high["bounded_80"] and open_high["width_80"] is None
    assert open_low["covered_95"] and open_low["interval_95"] == [None, 4e5]
    assert not missed["covered_80"] and missed["bounded_80"] and missed["width_80"] == pytest.approx(1.0)
    assert wide["covered_80"] and wide["width_80"] == pytest.approx(2.0)
    assert not none["covered_80"] and not none["bounded_80"] and not none["result"]
    f = bench.figures([open_high, open_low, missed, wide, none])
    assert f["coverage_80"] == pytest.approx(3 / 5) and f["coverage_95"] == pytest.approx(3 / 5)
    assert f["open_80"] == 3 and f["median_width_80"] == pytest.approx(1.5)
    assert f["in_grid"] == 5 and f["bounded_decade_80"] == pytest.approx(1 / 5)  # only `missed`: bounded, 1 decade
    assert bench.reported_interval(_record(1e5, None), "80") == (1e5, math.inf)


def test_fixed_table_is_the_bench_case() -> None:
    case = bench.draw_case(0, "transfer-exp", 0.3, seed=0)
    assert case.dstar == pytest.approx(3e5, rel=1e-9) and case.n1 == 131_392
    for kind, df in bench.tables(case).items():
        pd.testing.assert_frame_equal(pd.read_csv(FIXED / f"{kind}.csv"), df, check_dtype=False, rtol=1e-12)


def test_reads_the_interval_of_a_real_analysis() -> None:
    """The user's path on the fixed table, with a small bootstrap: the record's intervals reach the score (a field
    the bench no longer finds would leave every case unbounded and uncovered, and the figures would not say why)."""
    row = bench.run_case((bench.draw_case(0, "transfer-exp", 0.3, seed=0), 4))
    assert row["result"] and "error" not in row and row["state"] == "crossing"
    assert row["interval_80"] is not None and row["interval_95"] is not None
    assert row["bounded_80"] == (None not in row["interval_80"])
    parts = row["parts_80"]  # each part of the interval, scored alone: the reported one lies in their hull
    assert set(parts) == {"band", "mixture", "bracket"} and parts["band"] is not None
    assert isinstance(row["resolvable"], bool)


def test_a_truth_the_runs_cannot_tell_apart_past_the_grid_is_not_resolvable() -> None:
    """Seed 0's effective-tokens truth at 1x ties at the top budget and stays within the pairs' noise at 4x it;
    the curved one at 0.3x is beyond it there (their true log gaps at 4e6: -1.1% and -5.2%)."""
    assert bench.resolvable(bench.draw_case(4, "effective", 1.0, seed=0)) is False
    assert bench.resolvable(bench.draw_case(1, "curved", 0.3, seed=0)) is True


@pytest.mark.slow  # a bench run: one case through the analysis in a worker process
def test_a_run_writes_its_figures_and_reads_them_back(tmp_path, capsys) -> None:
    out = tmp_path / "run.json"
    ran = bench.main(["--cases", "1", "--paper", "0", "--bootstrap", "4", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["done"] == 1 and (saved["rows"][0]["family"], saved["rows"][0]["placement"]) == ("effective", 0.3)
    assert saved["figures"] == ran["figures"] and saved["figures"]["cross-family (all)"]["n"] == 1
    assert bench.main(["--from-json", str(out)])["figures"] == saved["figures"]
    assert "| cross-family (all) | 1 |" in capsys.readouterr().out
