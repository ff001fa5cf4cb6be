"""Every law form of an arm fitted to one table, E fixed as the analysis fixes it (fitting/forms.py).

A form's fit is a point fit; its bootstrap, when asked, draws only as many resamples as the form's weight earns it
(fitting/answer.py mixes the forms' D* samples by weight, so a form with weight 0.1 needs a tenth of them). The
saturating form shares Eq. 12's fit (it differs from it only past the turning point), and a form the analysis has
already fitted (``known``: the paper's forms) is not fitted again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from upscale.fitting.bootstrap import bootstrap
from upscale.fitting.errors import FitError
from upscale.fitting.fit import FitOptions, FitResult, fit, fit_from
from upscale.fitting.forms import FORMS, Form
from upscale.fitting.laws import LOSS


@dataclass(frozen=True)
class FormFit:
    """One form's fit: its parameters, bootstrap samples (rows in the law's parameter order; possibly none), the
    RMS of its log residuals on the rows it was fitted to, and the range of each column it saw."""

    form: Form
    params: dict[str, float]
    samples: np.ndarray
    rms: float
    trained: dict[str, tuple[float, float]]
    result: FitResult | None = None  # the fit itself, for a later bootstrap (None when reused from another fit)

    def row(self) -> np.ndarray:
        return np.array([[self.params[n] for n in self.form.law.param_names]], dtype=float)

    def log_predict(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        return self.form.log_losses(self.row(), columns)[:, 0]


def _columns(form: Form, df: pd.DataFrame) -> dict[str, np.ndarray]:
    return {c: df[c].to_numpy(dtype=float) for c in form.law.columns}


def _made(form: Form, df: pd.DataFrame, params: dict[str, float], samples: np.ndarray,
          result: FitResult | None) -> FormFit:
    cols = _columns(form, df)
    resid = form.log_losses(np.array([[params[n] for n in form.law.param_names]]), cols)[:, 0] \
        - np.log(df[LOSS].to_numpy(dtype=float))
    trained = {c: (float(v.min()), float(v.max())) for c, v in cols.items()}
    return FormFit(form, params, samples, float(np.sqrt(np.mean(resid ** 2))), trained, result)


def _fit(f: Form, df: pd.DataFrame, E: float, options: FitOptions, start: FormFit | None) -> FitResult:
    """The fit of ``f`` on ``df``; from ``start`` (the form's fit on more of the grid, or the fit of a form it
    nests) when given: one BFGS run from there, the multi-start only if it does not converge (a backtest refits
    3 x 7 forms; this is most of its cost)."""
    warm = fit_from(f.law, df, start.params, {"E": E}, options) if start is not None else None
    return warm if warm is not None else fit(f.law, df, {"E": E}, options)


NESTS = {"chinchilla-int": "chinchilla", "joint-noint": "joint"}  # a form that is its primary with alpha3 = 0
FORM_STARTS = 4  # BFGS runs of a form with no start to warm from (the paper's laws get fit.py's 8 in the analysis)


def _nested_start(f: Form, fits: Mapping[str, FormFit]) -> FormFit | None:
    """The primary fit as a start for a form it nests (``NESTS``), with the missing interaction at 0: one BFGS run
    from the paper's optimum instead of a multi-start."""
    base = fits.get(NESTS.get(f.name, ""))
    if base is None:
        return None
    params = {n: base.params.get(n, 0.0) for n in f.law.param_names}
    return replace(base, form=f, params=params)


def fit_forms(arm: str, df: pd.DataFrame, E: float,
              known: Mapping[str, tuple[dict[str, float], np.ndarray]] | None = None,
              starts: Mapping[str, FormFit] | None = None) -> tuple[dict[str, FormFit], dict[str, str]]:
    """Point fits of every form of ``arm`` on ``df`` with E fixed (``starts``: fits to warm-start from, by form):
    the fits, and for each form that could not be fitted, why."""
    known = known or {}
    fits: dict[str, FormFit] = {}
    failed: dict[str, str] = {}
    options = FitOptions(n_starts=FORM_STARTS)
    for f in FORMS[arm]:
        key = "joint" if f.saturating else f.name
        if key in known:
            params, samples = known[key]
            rows = np.empty((0, len(params))) if samples is None else np.asarray(samples, dtype=float)
            fits[f.name] = _made(f, df, dict(params), rows.reshape(-1, len(params)), None)
            continue
        if f.saturating and "joint" in fits:
            base = fits["joint"]
            fits[f.name] = _made(f, df, base.params, base.samples, base.result)
            continue
        start = (starts or {}).get(f.name) or _nested_start(f, fits)
        try:
            result = _fit(f, df, E, options, start)
        except FitError as e:
            failed[f.name] = str(e)
            continue
        fits[f.name] = _made(f, df, result.params, np.empty((0, len(f.law.params))), result)
    return fits, failed


def with_samples(fitted: FormFit, df: pd.DataFrame, n: int, seed: int,
                 fixed_draws: Sequence[dict[str, float] | None] | None) -> FormFit:
    """``fitted`` with ``n`` cluster-bootstrap samples (E at its own draws when ``fixed_draws`` are given), or as it
    is when it has them already or cannot be refitted."""
    if n <= 0 or len(fitted.samples) >= n or fitted.result is None:
        return fitted
    draws = list(fixed_draws[:n]) if fixed_draws is not None and len(fixed_draws) >= n else None
    boot = bootstrap(fitted.form.law, df, fitted.result, n, seed, fixed_draws=draws)
    return FormFit(fitted.form, fitted.params, boot.samples, fitted.rms, fitted.trained, fitted.result)
