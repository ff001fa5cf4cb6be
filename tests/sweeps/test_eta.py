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


def test_the_start_up_before_the_first_finish_is_not_charged_to_the_rest() -> None:
    """The demo's jump: its first, small segment (10 planned seconds of 546) finished 220 s in, most of them Ray's
    workers starting and DeepSpeed's op build. Paced from the start, the 536 planned seconds left would take
    536 * 22 s, over three hours; paced from the first finish on, the plan counts down from then."""
    assert eta_s(546.0, 10.0, 220.0) == pytest.approx(536.0 * 22.0)  # without ``first``: the jump
    assert eta_s(546.0, 10.0, 220.0, first=(220.0, 10.0)) == pytest.approx(536.0)
    assert eta_s(546.0, 10.0, 320.0, first=(220.0, 10.0)) == pytest.approx(436.0)  # counted down from then
    # then the segments after the first set the pace: 100 planned seconds in 200 s, twice as slow as planned
    assert eta_s(546.0, 110.0, 420.0, first=(220.0, 10.0)) == pytest.approx(436.0 * 2.0)
    # a start-up that outran the plan leaves the segments waiting their planned time, never 0
    assert eta_s(546.0, 10.0, 900.0, planned_waiting_s=50.0, first=(220.0, 10.0)) == pytest.approx(50.0)
