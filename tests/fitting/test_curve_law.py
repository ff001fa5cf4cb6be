"""The multi-power law of loss curves: recovery, the constant-LR limit, held-out decays, refused input."""

from __future__ import annotations

import numpy as np
import pytest

from upscale.fitting.curve_law import DECAY_PARAMS, MULTI_POWER, Curve, _Problem, _terms, fit_curves, predict
from upscale.fitting.errors import FitError
from upscale.fitting.fit import FitOptions

# The paper's fit of its 25M model (LRs in absolute units, peak 3e-4)
TRUTH = {"L0": 3.04, "A": 0.525, "alpha": 0.508, "B": 363.8, "C": 2.066, "beta": 0.583, "gamma": 0.641}
PEAK = 3e-4


def wsd(end: int, decay_start: int | None, shape: str = "linear", warmup: int = 50) -> np.ndarray:
    s = np.arange(1, end + 1, dtype=float)
    lr = np.minimum(s / warmup, 1.0)
    if decay_start is not None:
        x = np.clip((s - decay_start) / (end - decay_start), 0, 1)
        decay = {"linear": 1 - 0.9 * x, "cosine": 0.1 + 0.45 * (1 + np.cos(np.pi * x)), "1-sqrt": 1 - 0.9 * np.sqrt(x)}
        lr = np.where(s > decay_start, decay[shape], lr)
    return PEAK * lr


def observed(lr: np.ndarray, steps: np.ndarray, noise: float, seed: int) -> Curve:
    clean = predict(TRUTH, Curve(lr, steps))
    return Curve(lr, steps, clean * np.exp(np.random.default_rng(seed).normal(0, noise, steps.size)))


def trunk_and_decay(noise: float) -> tuple[Curve, Curve]:
    trunk = observed(wsd(1600, None), np.arange(60, 1601, 40), noise, 1)
    decay = observed(wsd(1000, 800), np.arange(800, 1001, 20), noise, 2)
    return trunk, decay


def test_constant_schedule_has_no_decay_term():
    lr = wsd(500, None)
    steps = np.arange(60, 501, 40)
    no_decay = {**TRUTH, "B": 0.0}
    assert np.array_equal(predict(TRUTH, Curve(lr, steps)), predict(no_decay, Curve(lr, steps)))
    area = np.cumsum(lr)[steps - 1]
    assert np.allclose(predict(TRUTH, Curve(lr, steps)), TRUTH["L0"] + TRUTH["A"] * area ** -TRUTH["alpha"])
    # a decay's own term lowers the loss, more the longer the decay lasts
    gain = [predict(no_decay, c)[0] - predict(TRUTH, c)[0] for c in (Curve(wsd(e, 400), [e]) for e in (420, 460, 500))]
    assert 0 < gain[0] < gain[1] < gain[2]


def test_decay_to_zero_lr_is_finite():
    lr = wsd(500, 400, "1-sqrt")
    lr[-2:] = 0.0
    problem = _Problem(MULTI_POWER, _terms([Curve(lr, np.array([450, 500]), np.array([4.5, 4.4]))], PEAK),
                       np.array([4.5, 4.4]), {}, 1e-3)
    f, g = problem.value_and_grad(problem.starts()[0])
    assert np.isfinite(f) and np.all(np.isfinite(g))
    # a step at LR 0 trains nothing, so it changes nothing: its own drop counts from the area after it (none yet)
    last = predict(TRUTH, Curve(lr, np.array([497, 498, 499, 500])))
    assert last[0] > last[1] and last[1] == pytest.approx(last[2]) and last[2] == pytest.approx(last[3])


def test_gradient_is_exact():
    trunk, decay = trunk_and_decay(0.003)
    problem = _Problem(MULTI_POWER, _terms([trunk, decay], PEAK), np.concatenate([trunk.loss, decay.loss]), {}, 1e-3)
    theta = problem.starts()[0]
    g = problem.value_and_grad(theta)[1]
    h = 1e-6
    numeric = [(problem.value_and_grad(theta + e)[0] - problem.value_and_grad(theta - e)[0]) / (2 * h)
               for e in np.eye(theta.size) * h]
    assert np.allclose(g, numeric, rtol=1e-4, atol=1e-9)


def test_a_fixed_decay_term_is_the_one_the_free_law_computes_with_an_exact_gradient():
    trunk, decay = trunk_and_decay(0.003)
    T, y = _terms([trunk, decay], PEAK), np.concatenate([trunk.loss, decay.loss])
    free = _Problem(MULTI_POWER, T, y, {}, 1e-3)
    theta = free.starts()[0]
    fixed = _Problem(MULTI_POWER, T, y, {k: v for k, v in free.params(theta).items() if k in DECAY_PARAMS}, 1e-3)
    assert fixed.fixed_decay is not None  # computed once, not per step of the search
    sub = theta[[i for i, p in enumerate(free.free) if p.name not in DECAY_PARAMS]]
    f, g = fixed.value_and_grad(sub)
    assert f == pytest.approx(free.value_and_grad(theta)[0], rel=1e-12)
    h = 1e-6
    numeric = [(fixed.value_and_grad(sub + e)[0] - fixed.value_and_grad(sub - e)[0]) / (2 * h)
               for e in np.eye(sub.size) * h]
    assert np.allclose(g, numeric, rtol=1e-4, atol=1e-9)


def test_recovers_its_parameters_and_predicts_held_out_decays():
    trunk, decay = trunk_and_decay(0.0)
    fit = fit_curves([trunk, decay], options=FitOptions(n_starts=2))
    for k in ("L0", "A", "alpha"):  # the trunk pins these; one decay leaves beta, B trading off along a valley
        assert fit.params[k] == pytest.approx(TRUTH[k], rel=0.02)
    assert not fit.warnings
    for start, end, shape in ((1200, 1500, "cosine"), (1400, 1600, "1-sqrt"), (600, 667, "linear")):
        held = Curve(wsd(end, start, shape), [end])
        assert predict(fit.params, held)[0] == pytest.approx(predict(TRUTH, held)[0], rel=0.003)


def test_noisy_curves_predict_a_held_out_decay_better_than_the_last_stable_loss():
    trunk, decay = trunk_and_decay(0.003)
    fit = fit_curves([trunk, decay], options=FitOptions(n_starts=2))
    held = Curve(wsd(1500, 1200, "cosine"), [1500])
    true = predict(TRUTH, held)[0]
    last_stable = predict(TRUTH, Curve(wsd(1200, None), [1200]))[0]
    assert abs(predict(fit.params, held)[0] / true - 1) < 0.2 * abs(last_stable / true - 1)


def test_stable_curve_alone_predicts_with_transferred_decay_parameters():
    trunk, _ = trunk_and_decay(0.0)
    with pytest.raises(FitError, match="not identified: fix them"):
        fit_curves([trunk])
    fit = fit_curves([trunk], fixed={k: TRUTH[k] for k in DECAY_PARAMS})
    assert fit.free == ("L0", "A", "alpha")
    held = Curve(wsd(1500, 1200, "1-sqrt"), [1500])
    assert predict(fit.params, held)[0] == pytest.approx(predict(TRUTH, held)[0], rel=1e-3)


@pytest.mark.parametrize(("lr", "steps", "loss", "match"), [
    (np.full(10, 1e-3), [5, 11], [3.0, 2.9], "the schedule has 10 LRs"),
    (np.full(10, 1e-3), [0, 5], [3.0, 2.9], "steps count from 1"),
    (np.array([1e-3, np.nan, 1e-3]), [1, 3], [3.0, 2.9], "finite LRs"),
    (np.full(10, 1e-3), [4, 5], [3.0, np.nan], "finite and positive"),
    (np.full(10, 1e-3), [4.5, 5], [3.0, 2.9], "whole step counts"),
    (np.full(10, 1e-3), [4, 5], [3.0], "one loss per measured step"),
])
def test_refuses_bad_curves(lr, steps, loss, match):
    with pytest.raises(FitError, match=match):
        Curve(lr, np.array(steps), np.array(loss))


def test_refuses_unknown_or_unconvertible_fixed_parameters():
    trunk, decay = trunk_and_decay(0.0)
    with pytest.raises(FitError, match="no parameter"):
        fit_curves([trunk, decay], fixed={"E": 1.0})
    with pytest.raises(FitError, match="needs gamma fixed"):
        fit_curves([trunk, decay], fixed={"C": 2.0})
