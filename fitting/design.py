"""Active design: which grid extension buys the most certainty about D* per FLOP (docs/laws.md, "Active design").

The target is log D*, where the fitted from-scratch law L_MoE(N1, D) and the upcycled law L_up(D, D, N1) cross at
one N1, not the losses themselves: the criterion is c-optimal. By the implicit function theorem on the gap
g(D, θ) = L_MoE − L_up at the crossing, c = d log D*/dθ = −(∂g/∂θ) / (∂g/∂log D), a gradient over the free
parameters of both laws (E is fixed in both fits, as the analysis fixes it). The delta method then gives
Var(log D*) ≈ cᵀ Cov(θ̂) c, with Cov(θ̂) that of the least-squares fit in log loss.

Observations are not independent: the branches decayed from one trunk share its noise. Each trunk's residuals are
modelled as σ²·I + τ²·11ᵀ (a per-trunk random effect τ on top of per-point noise σ). The least-squares covariance is
then the sandwich (JᵀJ)⁻¹(σ²JᵀJ + τ²·Σ_t (1ᵀJ_t)ᵀ(1ᵀJ_t))(JᵀJ)⁻¹: a trunk's shared draw does not average out over
its branches, so a fifth branch on a trunk buys less than a first branch on a new one, which is what makes "a new
N1 versus a new D2" a real trade-off. (``information`` is the weighted fit's counterpart, for comparison.)

Rows predicted from a trunk's loss curve (fitting/curve_observations.py) count as observations with extra
variance: a predicted row's error is its family's held-out sd, so the fit weighs it `prediction_weight` (σ²/(σ² +
sd_pred²)) and the covariance is the weighted sandwich (JᵀWJ)⁻¹ JᵀWΣWJ (JᵀWJ)⁻¹ with Σ the per-trunk covariance plus
the predicted rows' extra variance (they share their trunk's τ). Observing a predicted point replaces its predicted row
(``Rows.__add__``), so an action is credited only with what the curve did not already tell. ``can_move`` says
whether any of a trunk's remaining rows could narrow D*'s interval (a trunk that cannot is stopped).

An action (a grid extension) adds several observations at once, with a marginal cost that depends on what is already
bought (shared trunks). ``greedy`` picks actions one at a time by shrinkage of the D* interval per FLOP under one
budget and stops when the interval is narrower than a tolerance. Pure numerics: costs and the rows an action adds are
the caller's (control/suggest.py asks the planner and the store; bench/active_design.py a simulated DAG).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from upscale.fitting.curve_observations import prediction_weight
from upscale.fitting.dstar import crossings
from upscale.fitting.laws import Law, Table
from upscale.fitting.summary import FittedLaw

Z80 = 1.2815515655446004  # the normal quantile of 0.9: an 80% interval is ±Z80 standard deviations
Z95 = 1.959963984540054  # and of 0.975: a 95% interval (DstarCriterion.quantile: the t quantiles used for D*)
PRIOR_SD = 0.005  # per-point and per-trunk noise of log loss assumed before the residuals say otherwise
PRIOR_WEIGHT = 4.0  # how many residual degrees of freedom the prior noise counts as
LAWS = ("moe", "up")  # the two fits the criterion reads: from scratch (D, N) and upcycled (D1, D2, N1)


def free_params(law: Law, fixed: Mapping[str, float]) -> tuple[str, ...]:
    return tuple(n for n in law.param_names if n not in fixed)


def log_loss_jacobian(law: Law, params: Mapping[str, float], table: Table,
                      free: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """L̂ at the rows of ``table`` and d log L̂ / dθ (rows x ``free``), θ in fitted coordinates (log of a scale, an
    exponent as is): the law is a sum of exp(X·θ) terms, so the derivative is exact."""
    theta = np.array([law.param(n).to_fitted(params[n]) for n in law.param_names])
    X = law.design(table)
    terms = np.exp(X @ theta)  # (term, row)
    loss = terms.sum(axis=0)
    J = np.einsum("kn,knp->np", terms, X) / loss[:, None]
    columns = [law.param_names.index(n) for n in free]
    return loss, J[:, columns]


@dataclass(frozen=True)
class Rows:
    """Observations of one law as the criterion sees them: their log-loss Jacobian, the trunk of each, and for rows
    predicted from a curve rather than observed (docs/laws.md, "Active design") the variance each adds to the point
    noise (``extra``: sd_pred², 0 for an observed row) and the grid point each row is (``keys``). Adding rows that
    observe a point replaces its predicted row: observing what a curve already told gains only the difference."""

    J: np.ndarray  # (n, p)
    trunks: tuple[Hashable, ...]
    extra: np.ndarray | None = None  # (n,) variance beyond the point noise; None: every row observed
    keys: tuple[Hashable, ...] | None = None  # (n,) which grid point each row is; None: no row replaces another

    @classmethod
    def empty(cls, p: int) -> Rows:
        return cls(np.zeros((0, p)), ())

    @classmethod
    def predicted(cls, J: np.ndarray, trunks: Sequence[Hashable], keys: Sequence[Hashable], sd_pred: float) -> Rows:
        """Rows predicted with held-out error ``sd_pred`` (of log loss)."""
        return cls(J, tuple(trunks), np.full(len(trunks), sd_pred ** 2), tuple(keys))

    def extras(self) -> np.ndarray:
        return np.zeros(len(self)) if self.extra is None else self.extra

    def all_keys(self) -> tuple[Hashable, ...]:
        return (None,) * len(self) if self.keys is None else self.keys

    def __add__(self, other: Rows) -> Rows:
        """Both sets of rows; of two rows with one key, the one with less extra variance (the observed one)."""
        extra = np.concatenate([self.extras(), other.extras()])
        keys = self.all_keys() + other.all_keys()
        best: dict[Hashable, int] = {}
        for i, k in enumerate(keys):
            if k is not None and (k not in best or extra[i] < extra[best[k]]):
                best[k] = i
        keep = [i for i, k in enumerate(keys) if k is None or best[k] == i]
        J = np.vstack([self.J, other.J])[keep]
        trunks = self.trunks + other.trunks
        if self.extra is None and other.extra is None and self.keys is None and other.keys is None:
            return Rows(J, tuple(trunks[i] for i in keep))
        return Rows(J, tuple(trunks[i] for i in keep), extra[keep], tuple(keys[i] for i in keep))

    def observed(self) -> Rows:
        """The rows observed, without the predicted ones."""
        keep = self.extras() == 0
        return Rows(self.J[keep], tuple(t for t, k in zip(self.trunks, keep, strict=True) if k))

    def __len__(self) -> int:
        return len(self.trunks)


def _trunk_index(trunks: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    """Each row's trunk as a number 0..k-1 (in order of first appearance), and k."""
    codes: dict[Hashable, int] = {}
    return np.array([codes.setdefault(t, len(codes)) for t in trunks], dtype=int), len(codes)


def _trunk_sums(rows: Rows) -> tuple[np.ndarray, np.ndarray]:
    """1ᵀJ_t for every trunk t, and each trunk's number of rows (trunks numbered as `_trunk_index` numbers them)."""
    index, k = _trunk_index(rows.trunks)
    sums = np.zeros((k, rows.J.shape[1]))
    np.add.at(sums, index, rows.J)
    return sums, np.bincount(index, minlength=k).astype(float)


def information(rows: Rows, point_sd: float, trunk_sd: float) -> np.ndarray:
    """Σ over trunks of J_tᵀ (σ²I + τ²11ᵀ)⁻¹ J_t: the information of correlated branches about θ (what a fit
    weighted by the trunk covariance attains)."""
    p = rows.J.shape[1]
    if not len(rows):
        return np.zeros((p, p))
    s2, t2 = point_sd ** 2, trunk_sd ** 2
    sums, counts = _trunk_sums(rows)
    c = t2 / (s2 + counts * t2)
    return (rows.J.T @ rows.J - (sums * c[:, None]).T @ sums) / s2


def least_squares_covariance(rows: Rows, point_sd: float, trunk_sd: float) -> np.ndarray:
    """Cov(θ̂) of a weighted least-squares fit in log loss (what fitting/fit.py and the bench fit; an observed row
    weighs 1, a predicted one `prediction_weight`) when each trunk's residuals are σ²I + diag(extra) + τ²11ᵀ: the
    sandwich (JᵀWJ)⁻¹ JᵀWΣWJ (JᵀWJ)⁻¹. Wider than the inverse of ``information``: the fit does not down-weight the
    branches of one trunk, and a predicted row still carries its trunk's draw."""
    p = rows.J.shape[1]
    if not len(rows):
        return np.full((p, p), np.inf)
    s2 = point_sd ** 2
    w = prediction_weight(point_sd, np.sqrt(rows.extras()))
    weighted = Rows(rows.J * w[:, None], rows.trunks)
    sums, _ = _trunk_sums(weighted)
    bread = np.linalg.pinv(rows.J.T @ weighted.J, rcond=1e-12, hermitian=True)
    meat = s2 * rows.J.T @ weighted.J + trunk_sd ** 2 * sums.T @ sums  # w²(σ² + extra) = w·σ²
    return bread @ meat @ bread


@dataclass(frozen=True)
class Noise:
    """Per-point (σ) and per-trunk (τ) standard deviations of log loss."""

    point_sd: float
    trunk_sd: float

    def to_json(self) -> dict[str, float]:
        return {"point_sd": self.point_sd, "trunk_sd": self.trunk_sd}


def noise_from_fits(fits: Sequence[tuple[np.ndarray, Rows]], prior_sd: float = PRIOR_SD,
                    prior_weight: float = PRIOR_WEIGHT) -> Noise:
    """σ and τ from the log-loss residuals of least-squares fits (each law's residuals with its Rows at the fit) by
    moments that count what the fit absorbed: with M = I − J(JᵀJ)⁺Jᵀ the fit's residual maker, Z the trunk
    indicator and P the within-trunk projector, E[rᵀr] = σ²·tr(M) + τ²·tr(ZᵀMZ) and E[rᵀPr] = σ²·tr(PM) +
    τ²·‖PMZ‖². A fit with few trunks per size soaks up much of the trunk effects (a size's only trunk shifts its
    law), so dividing by the plain degrees of freedom would understate τ. Each equation is shrunk towards
    ``prior_sd`` with ``prior_weight`` pseudo degrees of freedom, so that a small pilot grid neither claims zero
    noise nor explodes."""
    a = np.zeros((2, 2))
    b = np.zeros(2)
    for r, rows in fits:
        r = np.asarray(r, float)
        if not r.size:
            continue
        J = rows.J
        sums, counts = _trunk_sums(rows)
        index, _ = _trunk_index(rows.trunks)
        bread = np.linalg.pinv(J.T @ J, rcond=1e-12, hermitian=True)
        within_J = J - (sums / counts[:, None])[index]  # PJ
        r_means = np.bincount(index, weights=r) / counts
        within_r = r - r_means[index]  # Pr
        pmz = within_J @ bread @ sums.T  # −PMZ: (n, trunks)
        a += [[len(r) - np.trace(J.T @ J @ bread), float(counts.sum() - np.trace(sums @ bread @ sums.T))],
              [len(r) - len(counts) - np.trace(within_J.T @ within_J @ bread), float((pmz ** 2).sum())]]
        b += [r @ r, within_r @ within_r]
    p2, w = prior_sd ** 2, prior_weight
    a += [[w, w], [w, 0.0]]
    b += [2 * w * p2, w * p2]
    point2, trunk2 = np.linalg.solve(a, b)
    if trunk2 < 0:  # no trunk effect beyond what the within-trunk spread explains
        point2, trunk2 = b[1] / a[1, 0], 0.0
    return Noise(math.sqrt(max(point2, 1e-24)), math.sqrt(trunk2 + 1e-24))


def dstar_gradient(moe: FittedLaw, up: FittedLaw, n1: float, moe_free: Sequence[str],
                   up_free: Sequence[str]) -> tuple[float, np.ndarray | None]:
    """D* at ``n1`` and d log D*/dθ over (moe_free, up_free); None when the laws do not cross (D* is 0 or inf)."""
    dstar = crossings(moe, up, n1).dstar
    if not (math.isfinite(dstar) and dstar > 0):
        return dstar, None

    def gap(log_d: float) -> tuple[float, np.ndarray, np.ndarray]:
        d = np.array([math.exp(log_d)])
        lm, jm = log_loss_jacobian(moe.law, moe.params, {"D": d, "N": np.full(1, n1)}, moe_free)
        lu, ju = log_loss_jacobian(up.law, up.params, {"D1": d, "D2": d, "N1": np.full(1, n1)}, up_free)
        return float(lm[0] - lu[0]), lm[0] * jm[0], lu[0] * ju[0]

    h = 1e-4
    slope = (gap(math.log(dstar) + h)[0] - gap(math.log(dstar) - h)[0]) / (2 * h)
    _, dmoe, dup = gap(math.log(dstar))
    if slope == 0 or not math.isfinite(slope):
        return dstar, None
    return dstar, -np.concatenate([dmoe, -dup]) / slope


class DstarCriterion:
    """Var(log D*) ≈ cᵀ Cov(θ̂) c for the current observations plus any extra ones (c-optimality on D*), with the
    least-squares fit's covariance under the per-trunk noise model."""

    def __init__(self, gradient: np.ndarray, current: Mapping[str, Rows], noise: Noise) -> None:
        self.gradient = gradient
        self.current = dict(current)
        self.noise = noise
        self.sizes = [current[k].J.shape[1] for k in LAWS]

    def dof(self) -> int:
        """Degrees of freedom of the D* interval: the trunks behind the current observed rows, less one. The noise
        is estimated, and branches of one trunk share its draw, so the trunks, not the points, are what the estimate
        averages over (cluster-robust inference's G − 1); it is estimated from observed rows alone, so a trunk whose
        rows are all predicted from its curve adds none."""
        return max(len({t for k in LAWS for t in self.current[k].observed().trunks}) - 1, 1)

    def quantile(self, level: float) -> float:
        """The Student-t quantile of a central ``level`` interval on `dof` degrees of freedom: wider than the normal
        one (Z80, Z95) on a small grid, where a plug-in variance makes the delta method cover less than nominal."""
        from scipy.stats import t

        return float(t.ppf(0.5 + level / 2, self.dof()))

    def sd(self, extra: Sequence[Mapping[str, Rows]] = ()) -> float:
        """Standard deviation of log D* with the current rows and those of ``extra`` (several actions' rows)."""
        var, start = 0.0, 0
        for k, size in zip(LAWS, self.sizes, strict=True):
            rows = self.current[k]
            for e in extra:
                if k in e:
                    rows = rows + e[k]
            c = self.gradient[start:start + size]
            start += size
            if np.any(c != 0):  # the two fits are independent: their variances add
                var += float(c @ least_squares_covariance(rows, self.noise.point_sd, self.noise.trunk_sd) @ c)
        return math.sqrt(max(var, 0.0))

    def predicted_share(self) -> float:
        """The share of Var(log D*) that rests on predicted rows, as `variance_shares` splits it (the analysis's
        measure, fitting/evidence.py); NaN when the rows do not pin D* down."""
        parts, predicted, start = [], [], 0
        for k, size in zip(LAWS, self.sizes, strict=True):
            rows = self.current[k]
            parts.append((self.gradient[start:start + size], rows.J,
                          prediction_weight(self.noise.point_sd, np.sqrt(rows.extras()))))
            predicted.append(rows.extras() > 0)
            start += size
        shares = variance_shares(parts)
        return float(shares[np.concatenate(predicted)].sum()) if np.all(np.isfinite(shares)) else math.nan


STOP_GAIN = 0.01  # a trunk whose every remaining row narrows sd(log D*) by less than this share of it is stopped


def sd_shrink(criterion: DstarCriterion, rows: Mapping[str, Rows]) -> float:
    """The share by which ``rows``, observed at once, narrow sd(log D*); NaN when the sd is not finite now."""
    now = criterion.sd()
    return (now - criterion.sd([rows])) / now if math.isfinite(now) and now > 0 else math.nan


def can_move(criterion: DstarCriterion, remaining: Mapping[str, Rows], threshold: float = STOP_GAIN) -> bool:
    """Whether a trunk can still move D*: all of its ``remaining`` rows at once (its extension's predicted rows and
    every branch not yet observed) narrow sd(log D*) by at least ``threshold`` of it. A trunk that cannot is worth
    stopping: no single extension or branch of it gains more than all of them together."""
    return sd_shrink(criterion, remaining) >= threshold


@dataclass(frozen=True)
class Step:
    """One action chosen by ``greedy``: its marginal cost given the earlier ones and log D*'s sd after it."""

    action: Hashable
    cost: float
    sd_after: float


def greedy(criterion: DstarCriterion, actions: Sequence[Hashable],
           rows_of: Callable[[Hashable], Mapping[str, Rows]],
           cost_of: Callable[[list[Hashable], Hashable], float], budget: float,
           target_sd: float = 0.0, limit: int | None = None) -> tuple[list[Step], str]:
    """Actions chosen one at a time by (sd now − sd after) / marginal cost, each affordable in what is left of
    ``budget``, until the sd is at most ``target_sd`` (``"tolerance"``), nothing affordable helps (``"budget"``),
    nothing helps at all (``"no_gain"``) or ``limit`` actions are chosen (``"limit"``: a sequential design refits
    between actions). ``cost_of(chosen, action)``: the action's cost given those chosen."""
    chosen: list[Hashable] = []
    steps: list[Step] = []
    rows: list[Mapping[str, Rows]] = []
    sd_now, left = criterion.sd(), budget
    remaining = list(actions)
    while sd_now > target_sd:
        if limit is not None and len(steps) >= limit:
            return steps, "limit"
        best, best_score, best_cost, best_sd = None, 0.0, 0.0, sd_now
        helpful = False
        for a in remaining:
            cost = cost_of(chosen, a)
            sd = criterion.sd([*rows, rows_of(a)])
            gain = sd_now - sd
            if gain <= 1e-12 * max(sd_now, 1e-300) or cost <= 0:
                continue
            helpful = True
            if cost > left:
                continue
            if gain / cost > best_score:
                best, best_score, best_cost, best_sd = a, gain / cost, cost, sd
        if best is None:
            return steps, "budget" if helpful else "no_gain"
        chosen.append(best)
        rows.append(rows_of(best))
        remaining.remove(best)
        steps.append(Step(best, best_cost, best_sd))
        sd_now, left = best_sd, left - best_cost
    return steps, "tolerance"


def variance_shares(parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray:
    """Each row's share of Var(log D*), over the rows of every part (c, J, w) in order: w_i (cᵀM⁻¹j_i)² / Σ (the
    weighted fit moves θ̂ by M⁻¹w_i j_i per unit of row i's log loss, M = Σ w_i j_i j_iᵀ; fitting/evidence.py)."""
    terms = []
    for c, J, w in parts:
        M = (J * w[:, None]).T @ J
        a = J @ np.linalg.pinv(M, rcond=1e-12, hermitian=True) @ c
        terms.append(w * a * a)
    t = np.concatenate(terms)
    total = t.sum()
    return t / total if total > 0 else np.full(t.size, np.nan)


def delta_interval(dstar: float, sd: float, z: float = Z95) -> tuple[float, float]:
    """D*·exp(∓z·sd): the delta-method interval of D* for a standard deviation ``sd`` of log D*."""
    return dstar * math.exp(-z * sd), dstar * math.exp(z * sd)
