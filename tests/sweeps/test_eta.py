"""The sweep's time left: the plan's estimate counted down, then refined by the pace measured as segments finish."""

from __future__ import annotations

import pytest

from upscale.sweeps.planner import eta_s


def test_before_any_segment_finishes_the_plan_counts_down() -> None:
    assert eta_s(600.0, 0.0, 0.0) == 600.0
    assert eta_s(600.0, 0.0, 150.0) == 450.0
    # slower than planned: never 0 while segments wait to start (their planned time stands) ...
    assert eta_s(600.0, 0.0, 900.0, planned_waiting_s=120.0) == 120.0
    # ... and unknown, not 0, when only running segments remain past the plan's figure
    assert eta_s(600.0, 0.0, 900.0) is None
    assert eta_s(0.0, 0.0, 5.0) == 0.0  # nothing to train


def test_finished_segments_set_the_pace() -> None:
    # a third of the planned work done in the planned time: the rest as planned
    assert eta_s(600.0, 200.0, 200.0) == pytest.approx(400.0)
    # twice as slow as the plan: the remaining 400 planned seconds take 800
    assert eta_s(600.0, 200.0, 400.0) == pytest.approx(800.0)
    # four times faster (a GPU cluster running segments in parallel)
    assert eta_s(600.0, 400.0, 100.0) == pytest.approx(50.0)
    assert eta_s(600.0, 600.0, 700.0) == 0.0
