"""Progress callbacks of the long fitting loops reach the totals their callers size their bars with."""

from __future__ import annotations

from upscale.fitting.compare import compare, compare_steps
from upscale.fitting.data import read_table
from upscale.fitting.laws import get_law
from upscale.fitting.summary import grouped_report, report, report_steps
from upscale.fitting.synthetic import bundled_path


class Counter:
    def __init__(self) -> None:
        self.done = 0

    def __call__(self, k: int) -> None:
        assert k > 0
        self.done += k


def test_compare_reports_every_fit() -> None:
    df = read_table(bundled_path("moe")).head(24)
    laws = [get_law("chinchilla"), get_law("chinchilla")]
    seen = Counter()
    rows = compare(laws, df, {"E": 0.165}, progress=seen)
    assert len(rows) == 2 and seen.done == compare_steps(laws, df) == 2 * (24 + 2)


def test_report_counts_loo_and_bootstrap_refits() -> None:
    df = read_table(bundled_path("moe")).head(24)
    seen = Counter()
    rep, boot = report(get_law("chinchilla"), df, {"E": 0.165}, n_boot=8, progress=seen)
    assert boot is not None and rep["loo_rms"] is not None
    assert seen.done == report_steps(df, 8) == 8 + 24


def test_grouped_report_counts_every_group() -> None:
    df = read_table(bundled_path("moe")).head(24)
    df["half"] = [i % 2 for i in range(len(df))]
    seen = Counter()
    grouped_report(get_law("chinchilla"), df, ["half"], {"E": 0.165}, n_boot=3, progress=seen)
    assert seen.done == report_steps(df, 3 * 2)
