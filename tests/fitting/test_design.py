"""fitting/design.py: the per-trunk information equals the GLS information with the explicit covariance, the D*
gradient equals finite differences of D*, the delta-method sd (least-squares sandwich) matches the spread of refits
on simulated data, predicted rows enter as the weighted fit's sandwich and observing one replaces it, and greedy
spends one budget by shrinkage per cost and stops at the tolerance."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import least_squares

from upscale.fitting.design import (
    Z95,
    DstarCriterion,
    Noise,
    Rows,
    can_move,
    delta_interval,
    dstar_gradient,
    greedy,
    information,
    least_squares_covariance,
    log_loss_jacobian,
    noise_from_fits,
    prediction_weight,
)
from upscale.fitting.dstar import crossings
from upscale.fitting.laws import get_law
from upscale.fitting.summary import FittedLaw
from upscale.fitting.synthetic import TABLE2

CHIN, JOINT = get_law("chinchilla"), get_law("joint")
FREE_M = ("A", "alpha", "B", "beta")
FREE_U = ("A", "alpha1", "alpha2", "alpha3", "B", "beta")
N1 = 5.2e8


def test_trunk_information_is_the_gls_information() -> None:
    rng = np.random.default_rng(0)
    J = rng.normal(size=(7, 3))
    trunks = ("a", "a", "b", "a", "c", "c", "b")
    sigma, tau = 0.004, 0.006
    cov = sigma ** 2 * np.eye(7) + tau ** 2 * np.equal.outer(np.array(trunks), np.array(trunks))
    assert information(Rows(J, trunks), sigma, tau) == pytest.approx(J.T @ np.linalg.inv(cov) @ J, rel=1e-9)
    # a second branch on a trunk tells less than a branch on a new trunk
    one = information(Rows(J[:1], ("a",)), sigma, tau)
    same = information(Rows(J[:2], ("a", "a")), sigma, tau)
    other = information(Rows(J[:2], ("a", "z")), sigma, tau)
    assert np.trace(other) > np.trace(same) > np.trace(one)


def test_dstar_gradient_matches_finite_differences() -> None:
    moe, up = FittedLaw(CHIN, TABLE2["moe"]), FittedLaw(JOINT, TABLE2["upcycled"])
    dstar, grad = dstar_gradient(moe, up, N1, FREE_M, FREE_U)
    assert dstar == pytest.approx(crossings(moe, up, N1).dstar)
    h = 1e-7  # alpha3 multiplies log D1·log D2 (~500): larger steps leave the linear range
    for i, name in enumerate(FREE_M + FREE_U):
        law, fit = (CHIN, moe) if i < len(FREE_M) else (JOINT, up)
        p = law.param(name)
        logs = []
        for step in (h, -h):
            shifted = {**fit.params, name: p.to_user(p.to_fitted(fit.params[name]) + step)}
            pair = (FittedLaw(CHIN, shifted), up) if i < len(FREE_M) else (moe, FittedLaw(JOINT, shifted))
            logs.append(math.log(crossings(*pair, N1).dstar))
        numeric = (logs[0] - logs[1]) / (2 * h)
        assert grad[i] == pytest.approx(numeric, rel=2e-3, abs=1e-3), name
    never = FittedLaw(CHIN, {**TABLE2["moe"], "A": 1e3})  # from scratch never catches up: no crossing
    assert dstar_gradient(never, up, N1, FREE_M, FREE_U)[1] is None


def _grid() -> tuple[dict, dict, tuple, tuple]:
    sizes, budgets = (4.4e7, 9.8e7, 2.3e8, 5.2e8), (5e8, 2e9, 8e9, 3.2e10)
    m = {"D": np.repeat(budgets, 4)[None].repeat(1, 0).ravel(), "N": np.tile(sizes, 4)}
    up_rows = [(n, d1, d2) for n in sizes for d1 in budgets for d2 in budgets]
    u = {"N1": np.array([r[0] for r in up_rows]), "D1": np.array([r[1] for r in up_rows]),
         "D2": np.array([r[2] for r in up_rows])}
    return m, u, tuple(f"s{n}" for n in m["N"]), tuple(f"u{n}-{d1}" for n, d1, _ in up_rows)


def test_delta_method_sd_matches_refits_with_trunk_noise() -> None:
    """The criterion's sd of log D* is the spread of D* over least-squares fits to data with per-trunk and per-point
    noise (the sandwich: GLS's information would claim less)."""
    m, u, mt, ut = _grid()
    truth = {"moe": TABLE2["moe"], "up": TABLE2["upcycled"]}
    noise = Noise(0.001, 0.001)  # small enough for the linearisation to hold on this one-decade grid
    lm, Jm = log_loss_jacobian(CHIN, truth["moe"], m, FREE_M)
    lu, Ju = log_loss_jacobian(JOINT, truth["up"], u, FREE_U)
    _, grad = dstar_gradient(FittedLaw(CHIN, truth["moe"]), FittedLaw(JOINT, truth["up"]), N1, FREE_M, FREE_U)
    sd = DstarCriterion(grad, {"moe": Rows(Jm, mt), "up": Rows(Ju, ut)}, noise).sd()
    rng = np.random.default_rng(1)

    def draw(mean: np.ndarray, trunks: tuple) -> np.ndarray:
        names = sorted(set(trunks))
        effect = dict(zip(names, rng.normal(0, noise.trunk_sd, len(names)), strict=True))
        return np.log(mean) + np.array([effect[t] for t in trunks]) + rng.normal(0, noise.point_sd, len(trunks))

    def fit(law, params, free, table, y):
        def to(theta):
            return {**params, **{n: law.param(n).to_user(v) for n, v in zip(free, theta, strict=True)}}
        x0 = np.array([law.param(n).to_fitted(params[n]) for n in free])
        r = least_squares(lambda th: np.log(law.predict(to(th), table)) - y, x0,
                          jac=lambda th: log_loss_jacobian(law, to(th), table, free)[1])
        return FittedLaw(law, to(r.x))

    logs = np.array([math.log(crossings(fit(CHIN, truth["moe"], FREE_M, m, draw(lm, mt)),
                               fit(JOINT, truth["up"], FREE_U, u, draw(lu, ut)), N1).dstar) for _ in range(60)])
    robust_sd = 1.4826 * np.median(np.abs(logs - np.median(logs)))  # D* is nonlinear in θ: its tails are heavy
    assert 0.75 < robust_sd / sd < 1.3
    lo, hi = delta_interval(1e9, sd)
    assert hi / lo == pytest.approx(math.exp(2 * Z95 * sd))


def test_noise_from_fits_separates_trunk_and_point_noise() -> None:
    rng = np.random.default_rng(2)
    trunks = tuple(f"t{i}" for i in range(200) for _ in range(5))
    r = np.repeat(rng.normal(0, 0.02, 200), 5) + rng.normal(0, 0.01, 1000)
    est = noise_from_fits([(r - r.mean(), Rows(np.ones((1000, 1)), trunks))])
    assert est.point_sd == pytest.approx(0.01, rel=0.1) and est.trunk_sd == pytest.approx(0.02, rel=0.15)
    few = noise_from_fits([(np.zeros(2), Rows(np.eye(2), ("a", "b")))])  # the fit absorbs everything: the prior
    assert few.point_sd == pytest.approx(0.005) and few.trunk_sd == pytest.approx(0.005, rel=1e-3)


def test_noise_from_fits_is_unbiased_where_the_fit_absorbs_trunk_effects() -> None:
    """Eight trunks (sizes), four decays each, a law with a size slope: the fit takes up a share of every trunk's
    draw. Over many draws the estimates average to the truth; the plain degrees-of-freedom moments fall short."""
    rng = np.random.default_rng(5)
    trunks = tuple(f"t{i}" for i in range(8) for _ in range(4))
    size = np.repeat(np.linspace(-1, 1, 8), 4)
    tokens = np.tile(np.linspace(-1, 1, 4), 8)
    J = np.column_stack([np.ones(32), size, size ** 2, tokens])
    residual_maker = np.eye(32) - J @ np.linalg.pinv(J)
    point, trunk, plain = [], [], []
    for _ in range(400):
        r = residual_maker @ (np.repeat(rng.normal(0, 0.02, 8), 4) + rng.normal(0, 0.01, 32))
        est = noise_from_fits([(r, Rows(J, trunks))], prior_weight=0.0)
        point.append(est.point_sd ** 2)
        trunk.append(est.trunk_sd ** 2)
        within = ((r - np.repeat(r.reshape(8, 4).mean(axis=1), 4)) ** 2).sum() / (32 - 8)
        plain.append(max((r @ r) / (32 - 4) - within, 0.0))
    assert np.mean(point) == pytest.approx(0.01 ** 2, rel=0.05)
    assert np.mean(trunk) == pytest.approx(0.02 ** 2, rel=0.1)
    assert np.mean(plain) < 0.8 * 0.02 ** 2  # about 0.7 of it


def test_greedy_spends_one_budget_by_shrinkage_per_cost_and_stops_at_the_tolerance() -> None:
    base = Rows(np.eye(2), ("a", "b"))
    crit = DstarCriterion(np.array([1.0, 1.0, 0.0]), {"moe": base, "up": Rows(np.array([[1.0]]), ("c",))},
                          Noise(1.0, 0.0))
    rows = {"cheap-x": {"moe": Rows(np.array([[1.0, 0.0]]), ("d",))},
            "dear-y": {"moe": Rows(np.array([[0.0, 3.0]]), ("e",))},
            "useless": {"up": Rows(np.array([[1.0]]), ("f",))}}
    costs = {"cheap-x": 1.0, "dear-y": 5.0, "useless": 0.5}
    steps, why = greedy(crit, list(rows), rows.__getitem__, lambda chosen, a: costs[a], budget=10.0)
    assert [s.action for s in steps] == ["cheap-x", "dear-y"] and why == "no_gain"  # "useless": gradient 0 there
    assert steps[0].sd_after > steps[1].sd_after
    steps, why = greedy(crit, list(rows), rows.__getitem__, lambda chosen, a: costs[a], budget=3.0)
    assert [s.action for s in steps] == ["cheap-x"] and why == "budget"
    steps, why = greedy(crit, list(rows), rows.__getitem__, lambda chosen, a: costs[a], budget=10.0,
                        target_sd=crit.sd([rows["cheap-x"]]) + 1e-9)
    assert [s.action for s in steps] == ["cheap-x"] and why == "tolerance"


def test_weighted_sandwich_is_the_unweighted_one_without_predicted_rows_and_the_explicit_one_with_them() -> None:
    rng = np.random.default_rng(3)
    J = rng.normal(size=(8, 3))
    trunks = ("a", "a", "b", "a", "c", "c", "b", "c")
    sigma, tau = 0.004, 0.006
    cov = sigma ** 2 * np.eye(8) + tau ** 2 * np.equal.outer(np.array(trunks), np.array(trunks))
    bread = np.linalg.inv(J.T @ J)
    plain = least_squares_covariance(Rows(J, trunks), sigma, tau)
    assert plain == pytest.approx(bread @ J.T @ cov @ J @ bread, rel=1e-9)
    observed = Rows(J, trunks, np.zeros(8), tuple(range(8)))  # weights all 1, nothing predicted
    assert least_squares_covariance(observed, sigma, tau) == pytest.approx(plain, rel=1e-12)
    sd_pred = 0.01
    extra = np.array([0, 0, 0, 1, 0, 1, 1, 0]) * sd_pred ** 2
    W = np.diag([1.0 if e == 0 else prediction_weight(sigma, sd_pred) for e in extra])
    bread = np.linalg.inv(J.T @ W @ J)
    explicit = bread @ J.T @ W @ (cov + np.diag(extra)) @ W @ J @ bread
    assert least_squares_covariance(Rows(J, trunks, extra, tuple(range(8))), sigma, tau) == pytest.approx(
        explicit, rel=1e-9)
    assert prediction_weight(sigma, sd_pred) == pytest.approx(sigma ** 2 / (sigma ** 2 + sd_pred ** 2))


def test_observing_a_predicted_point_gains_less_than_observing_a_new_one() -> None:
    """A curve already told part of what a predicted point's decay would: observing it replaces its predicted row,
    and gains less than observing a point nobody predicted; a trunk none of whose rows can narrow D* cannot move."""
    rng = np.random.default_rng(4)
    J = rng.normal(size=(6, 2))
    base = Rows(J[:4], ("a", "a", "b", "c"))
    predicted = Rows.predicted(J[4:5], ("b",), ("p",), sd_pred=0.01)
    crit = DstarCriterion(np.array([1.0, 0.5, 0.0]), {"moe": base + predicted, "up": Rows(np.ones((1, 1)), ("u",))},
                          Noise(0.005, 0.003))
    now = crit.sd()
    observe_predicted = crit.sd([{"moe": Rows(J[4:5], ("b",), np.zeros(1), ("p",))}])
    assert len(crit.current["moe"] + Rows(J[4:5], ("b",), np.zeros(1), ("p",))) == 5  # replaced, not added
    unpredicted = DstarCriterion(crit.gradient, {"moe": base, "up": crit.current["up"]}, crit.noise)
    observe_new = unpredicted.sd([{"moe": Rows(J[4:5], ("b",), np.zeros(1), ("p",))}])
    assert observe_new == pytest.approx(observe_predicted, rel=1e-9)  # the same design once observed
    assert 0 < now - observe_predicted < unpredicted.sd() - observe_new
    assert 0 < crit.predicted_share() < 1
    only_predicted = Rows.predicted(J[5:], ("d",), ("q",), sd_pred=0.01)  # a trunk known only from its curve
    wider = DstarCriterion(crit.gradient, {"moe": crit.current["moe"] + only_predicted, "up": crit.current["up"]},
                           crit.noise)
    assert wider.dof() == crit.dof() == 3  # trunks a, b, c and u behind the observed rows: the noise's clusters
    assert can_move(crit, {"moe": Rows(J[5:], ("d",))})
    assert not can_move(crit, {"up": Rows(np.ones((1, 1)), ("v",))})  # its gradient is 0: nothing there moves D*
