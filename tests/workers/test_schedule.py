"""WSD and cosine multipliers checked against hand-computed tables at every boundary, plus the branch property:
a trunk (no decay) and a decay branch give the multipliers of one uninterrupted WSD run."""

from __future__ import annotations

import math

import pytest

from upscale.sweeps.segments import ScheduleSpec
from upscale.workers.errors import WorkerError
from upscale.workers.schedule import check_schedule, lr_multiplier

WSD = ScheduleSpec(warmup_tokens=100, final_lr_fraction=0.1)


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [(0, 0.0), (50, 0.5), (99, 0.99), (100, 1.0), (500, 1.0), (900, 1.0), (950, 0.55), (1000, 0.1)],
)
def test_wsd_linear_table(tokens: int, expected: float) -> None:
    # decay from 900 to 1000: linear from 1 to 0.1
    assert lr_multiplier(tokens, WSD, 900, 1000) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("shape", "mid"),
    [("linear", 1 - 0.9 * 0.25), ("cosine", 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))),
     ("1-sqrt", 1 - 0.9 * 0.5)],
)
def test_decay_shapes_at_start_quarter_and_end(shape: str, mid: float) -> None:
    s = ScheduleSpec(warmup_tokens=100, decay_shape=shape, final_lr_fraction=0.1)
    assert lr_multiplier(600, s, 600, 1000) == 1.0  # decay start: still the peak
    assert lr_multiplier(700, s, 600, 1000) == pytest.approx(mid, abs=1e-12)  # a quarter into the decay
    assert lr_multiplier(1000, s, 600, 1000) == pytest.approx(0.1, abs=1e-12)  # exactly the final fraction


def test_trunk_never_decays_and_matches_branch_before_the_branch_point() -> None:
    assert lr_multiplier(10**9, WSD, None, 10**9) == 1.0
    for t in range(0, 901, 10):
        assert lr_multiplier(t, WSD, None, 900) == lr_multiplier(t, WSD, 900, 1000)


def test_cosine_baseline_table() -> None:
    s = ScheduleSpec(kind="cosine", warmup_tokens=100, final_lr_fraction=0.0)
    assert lr_multiplier(50, s, None, 1100) == 0.5
    assert lr_multiplier(100, s, None, 1100) == 1.0
    assert lr_multiplier(600, s, None, 1100) == pytest.approx(0.5, abs=1e-12)
    assert lr_multiplier(1100, s, None, 1100) == pytest.approx(0.0, abs=1e-12)


def test_no_warmup_starts_at_peak() -> None:
    assert lr_multiplier(1, ScheduleSpec(warmup_tokens=0), None, 10) == 1.0


def test_budget_smaller_than_warmup_is_refused() -> None:
    with pytest.raises(WorkerError, match="budget too small for the warmup"):
        check_schedule(ScheduleSpec(warmup_tokens=1000), 800, 900)
    with pytest.raises(WorkerError, match="not larger than warmup"):
        check_schedule(ScheduleSpec(kind="cosine", warmup_tokens=1000), None, 1000)
    check_schedule(ScheduleSpec(warmup_tokens=1000), 1000, 1200)  # decay right after warmup is fine
