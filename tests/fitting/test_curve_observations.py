"""Decay ends predicted from trunk curves: held-out error measured, predictions refused without it."""

from __future__ import annotations

import numpy as np
import pytest

from upscale.fitting.curve_law import Curve
from upscale.fitting.curve_observations import MIN_HELD_OUT, TrunkCurves, predict_decay_ends
from upscale.fitting.errors import FitError

WARMUP = 50


def wsd(end: int, decay_start: int | None) -> np.ndarray:
    """Warmup, constant 1, then a linear decay to 0.1 from ``decay_start`` (steps 1..end)."""
    s = np.arange(1, end + 1, dtype=float)
    lr = np.minimum(s / WARMUP, 1.0)
    if decay_start is not None:
        lr = np.where(s > decay_start, 1.0 - 0.9 * (s - decay_start) / (end - decay_start), lr)
    return lr


def loss(lr: np.ndarray, steps: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
    """A law other than the multi-power one: a power law in the LR area plus a floor that follows an EMA of the LR."""
    ema, m = np.empty_like(lr), 0.0
    for i, eta in enumerate(lr):
        m += (eta - m) / 75.0
        ema[i] = m
    clean = 2.0 + scale * np.cumsum(lr)[steps - 1] ** -0.3 + 0.25 * ema[steps - 1]
    return clean * np.exp(rng.normal(0.0, 0.002, steps.size))


def family(rng: np.random.Generator, decays: dict[int, tuple[tuple[int, int], ...]]) -> list[TrunkCurves]:
    out = []
    for i, scale in enumerate((4.0, 5.0, 6.0)):
        lr, steps = wsd(1500, None), np.arange(75, 1501, 25)
        own = []
        for start, end in decays.get(i, ()):
            dl, at = wsd(end, start), np.arange(start + 5, end + 1, 5)
            own.append(Curve(dl, at, loss(dl, at, scale, rng)))
        out.append(TrunkCurves(f"t{i}", Curve(lr, steps, loss(lr, steps, scale, rng)), tuple(own)))
    return out


def test_interior_decays_are_predicted_within_their_measured_error():
    rng = np.random.default_rng(0)
    trunks = family(rng, {0: ((400, 450), (800, 900)), 1: ((800, 900),)})  # t2 borrows decay parameters
    wanted = [(f"t{i}", wsd(end, start)) for i in range(3) for start, end in ((1125, 1250), (1350, 1500))]
    true = np.array([loss(lr, np.array([lr.size]), 4.0 + int(t[1]), np.random.default_rng(1))[0] for t, lr in wanted])
    got = predict_decay_ends(trunks, wanted)
    assert got.usable and len(got.held_out) == 3 and not got.problems
    err = np.abs(np.log(got.losses / true))
    assert np.all(err < 0.03)  # the trunk alone (its loss at the branch point) is ~5% above every one of these ends
    assert np.all(np.abs(np.log(got.losses / true)) < 4 * got.sd + 0.005)
    assert got.to_json()["n_held_out"] == 3


def test_no_prediction_without_a_measured_error():
    rng = np.random.default_rng(0)
    trunks = family(rng, {0: ((400, 450),)})  # one decay: held out, it leaves nothing to fit the decay term with
    got = predict_decay_ends(trunks, [("t1", wsd(1250, 1125))])
    assert not got.usable and np.isnan(got.losses).all()
    assert any(f"need {MIN_HELD_OUT}" in p for p in got.problems)


def test_refusals_say_what_to_give():
    rng = np.random.default_rng(0)
    trunks = family(rng, {0: ((400, 450), (800, 900))})
    with pytest.raises(FitError, match="no curve for trunk"):
        predict_decay_ends(trunks, [("elsewhere", wsd(1250, 1125))])
    lr = wsd(450, 400)
    with pytest.raises(FitError, match="must be its end"):
        TrunkCurves("t", trunks[0].curve, (Curve(lr, np.array([425]), np.array([3.0])),))
