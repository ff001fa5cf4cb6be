"""D*, the catch-up budget and the verdict: where training the MoE from scratch overtakes upcycling.

D* (Eq. 13) solves L_MoE(N1, D) = L_upcycled(D1 = D, D2 = D, N1): the MoE law is fitted on (D, N) with N = N1
(as the paper's Table 2), the upcycled law on (D1, D2, N1). The gap L_MoE − L_upcycled is scanned on a log grid
and every sign change is refined with brentq, because the laws can cross twice (with the paper's Table 2
parameters at N1 = 1e9: ~3e9 and ~5e11 tokens). D* is the first crossing where upcycling stops winning.

Catch-up budget: for a user's (N1, D1, D2), the D_MoE at which from-scratch training reaches the upcycled loss.
The verdict follows the paper (Fig. 15, Sec. 5.1): upcycling is efficient when D_MoE exceeds the sunk cost D1.
``dstar_results`` is the `upscale dstar` JSON (``dstar_at``: D* and its interval at one N1; the closed form D*(N1)).

Where the data are: crossings are searched from SEARCH_FACTOR below the smallest trained budget to SEARCH_FACTOR
above the largest (the fits carry their trained ranges), every answer says how far it lies from those ranges and is
flagged as an extrapolation beyond EXTRAPOLATION_FACTOR, and an answer outside the law's sane region (``Limits``) is
refused (``OutOfRange``). Intervals are given at 80% and 95%; an end beyond the searched range is open (unbounded,
said in words), never confused with a missing interval. docs/laws.md, "Where the answer comes from" says why.
"""

from __future__ import annotations

import html
import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import brentq

from upscale.fitting import display
from upscale.fitting.bootstrap import percentile_interval
from upscale.fitting.errors import FitError
from upscale.fitting.laws import Design, Law
from upscale.fitting.summary import FittedLaw, finite_or_none

SEARCH_FACTOR = 100.0  # crossings are searched this far below the smallest and above the largest trained budget
TOKEN_RANGE = (1e6, 1e16)  # the search when the fits carry no trained range (parameters typed in, old reports)
N1_RANGE = (1e8, 1e11)  # the closed form's N1 span when the fits carry no trained sizes (the paper's Fig. 1 span)
EXTRAPOLATION_FACTOR = 10.0  # an answer further than this from the trained range (either way) is an extrapolation
DECISIVE = 0.8  # a verdict needs this share of bootstrap pairs behind it; between the two sides it is "undecided"
LEVELS = (0.8, 0.95)  # every interval is given at both
_GRID = 400
_ROWS = 1024  # parameter rows put through the grid at once: ~terms x 400 x 1024 floats (10 MB) per law


def check_pair(moe: FittedLaw, upcycled: FittedLaw) -> None:
    """The MoE fit must be on (D, N) and the upcycled fit on (D1, D2, N1)."""
    if set(moe.law.columns) != {"D", "N"}:
        raise FitError(f"the MoE fit must be of a (D, N) law such as 'chinchilla', not {moe.law.name!r}")
    if set(upcycled.law.columns) != {"D1", "D2", "N1"}:
        raise FitError(f"the upcycled fit must be of a (D1, D2, N1) law such as 'joint', not {upcycled.law.name!r}")


def moe_loss(moe: FittedLaw, n1: float, tokens: np.ndarray, params: dict[str, float] | None = None) -> np.ndarray:
    t = np.atleast_1d(np.asarray(tokens, dtype=float))
    return moe.law.predict(params or moe.params, {"D": t, "N": np.full(t.shape, n1)})


def upcycled_loss(up: FittedLaw, n1: float, d1: np.ndarray, d2: np.ndarray,
                  params: dict[str, float] | None = None) -> np.ndarray:
    d1, d2 = np.broadcast_arrays(np.atleast_1d(np.asarray(d1, float)), np.atleast_1d(np.asarray(d2, float)))
    return up.law.predict(params or up.params, {"D1": d1, "D2": d2, "N1": np.full(d1.shape, n1)})


class _Curve:
    """One law along the D* path at model size N1, for rows of parameters (the fit, bootstrap samples): its design
    planned once per N1 and its parameters converted once, where Law.predict redid both at every grid point, brentq
    step and sample. ``loss`` (one row) is Law.predict's to the bit; ``losses`` (a block of rows at once) may differ
    from it in the last bit, which is harmless where it is used: for the signs of the gap on the grid."""

    def __init__(self, law: Law, size_column: str, n1: float, rows: np.ndarray) -> None:
        self.design = Design(law, {size_column: n1})
        self.theta = law.fitted_rows(rows)

    def loss(self, X: np.ndarray, row: int) -> np.ndarray:
        """L̂ at the design's rows for parameter row ``row``."""
        return np.exp(X @ self.theta[row]).sum(axis=0)

    def losses(self, X: np.ndarray, rows: slice) -> np.ndarray:
        """L̂ (design row, parameter row) for a block of parameter rows: one matrix product (2-D: BLAS's gemm)."""
        K, n, p = X.shape
        return np.exp((X.reshape(K * n, p) @ self.theta[rows].T).reshape(K, n, -1)).sum(axis=0)


def _fit_row(fitted: FittedLaw, params: dict[str, float] | None = None) -> np.ndarray:
    """``params`` (default: the fit's) as one row in the law's parameter order."""
    values = params or fitted.params
    return np.array([[values[n] for n in fitted.law.param_names]], dtype=float)


def _sample_rows(moe: FittedLaw, up: FittedLaw) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap pairs (sample i of each fit, as many as the shorter side has; none without samples on both)."""
    ms, us = (np.empty((0, len(f.law.params))) if f.samples is None else np.asarray(f.samples, float)
              for f in (moe, up))
    n = min(len(ms), len(us))
    return ms[:n], us[:n]


def token_span(moe: FittedLaw, up: FittedLaw) -> tuple[float, float] | None:
    """The tokens the two fits were trained on: from the smallest to the largest of the from-scratch D, D1 and D2
    (None when a fit does not carry its trained range)."""
    spans = [moe.span("D"), up.span("D1"), up.span("D2")]
    if any(s is None for s in spans):
        return None
    return min(s[0] for s in spans), max(s[1] for s in spans)


def search_range(moe: FittedLaw, up: FittedLaw, factor: float = SEARCH_FACTOR) -> tuple[float, float]:
    """Where D* is searched: ``factor`` below the smallest trained budget to ``factor`` above the largest, so that
    every crossing near the data is found (TOKEN_RANGE for fits without a trained range)."""
    span = token_span(moe, up)
    return TOKEN_RANGE if span is None else (max(span[0] / factor, 1.0), span[1] * factor)


@dataclass(frozen=True)
class Crossings:
    """Every crossing in the searched range ``span`` and which side wins on each interval between them."""

    n1: float
    crossings: tuple[float, ...]
    segments: tuple[tuple[float, float, str], ...]  # (from, to, "upcycle" | "scratch")
    span: tuple[float, float] = TOKEN_RANGE

    @property
    def dstar(self) -> float:
        """The first crossing where upcycling stops winning (from upcycle to scratch as D grows); inf if upcycling
        wins from some point to the span's top without one (D* lies above the span), 0 if from scratch wins over the
        whole span (D* lies below it). A crossing where upcycling *starts* winning is not D*: below the data the
        upcycled law can blow up (its D1 and D2 terms at budgets never trained) and hand from scratch a spurious
        win there; it is still among ``crossings`` and ``segments``."""
        if all(side == "scratch" for _, _, side in self.segments):
            return 0.0
        upcycled = False
        for lo, _, side in self.segments:
            if side == "upcycle":
                upcycled = True
            elif upcycled:
                return lo
        return float("inf")


class _Path:
    """L_MoE(N1, D) and L_upcycled(D1 = D, D2 = D, N1) at one N1 (Eq. 13); parameter row r of both is one pair."""

    def __init__(self, moe: FittedLaw, up: FittedLaw, n1: float, moe_rows: np.ndarray, up_rows: np.ndarray,
                 span: tuple[float, float]) -> None:
        self.n1 = n1
        self.span = span
        self.moe = _Curve(moe.law, "N", n1, moe_rows)
        self.up = _Curve(up.law, "N1", n1, up_rows)

    def gap(self, log_d: np.ndarray, row: int) -> np.ndarray:
        d = np.exp(log_d)
        return self.moe.loss(self.moe.design({"D": d}), row) - self.up.loss(self.up.design({"D1": d, "D2": d}), row)

    def crossings(self) -> list[Crossings]:
        """The crossings of every row: the gap on the log grid for all rows at once (one design per law, one
        product per block of rows), then brentq on each sign change of each row."""
        x = np.linspace(*np.log(self.span), _GRID)
        d = np.exp(x)
        X_moe, X_up = self.moe.design({"D": d}), self.up.design({"D1": d, "D2": d})
        out = []
        for start in range(0, len(self.moe.theta), _ROWS):
            block = slice(start, start + _ROWS)
            g = self.moe.losses(X_moe, block) - self.up.losses(X_up, block)  # (grid, rows)
            change = np.sign(g[:-1]) * np.sign(g[1:]) < 0
            out.extend(self._row_crossings(start + r, x, np.flatnonzero(change[:, r])) for r in range(g.shape[1]))
        return out

    def _row_crossings(self, row: int, x: np.ndarray, brackets: np.ndarray) -> Crossings:
        roots = [float(np.exp(brentq(lambda v: self.gap(np.array([v]), row)[0], x[i], x[i + 1], xtol=1e-12)))
                 for i in brackets]
        edges = [self.span[0], *roots, self.span[1]]
        segments = []
        for lo, hi in itertools.pairwise(edges):
            mid = np.sqrt(lo * hi)
            segments.append((lo, hi, "upcycle" if self.gap(np.log([mid]), row)[0] > 0 else "scratch"))
        return Crossings(self.n1, tuple(roots), tuple(segments), self.span)


def crossings(moe: FittedLaw, up: FittedLaw, n1: float, moe_params: dict[str, float] | None = None,
              up_params: dict[str, float] | None = None, span: tuple[float, float] | None = None) -> Crossings:
    """Roots of L_MoE(N1, D) − L_upcycled(D, D, N1) over ``span`` (default ``search_range`` of the fits)."""
    return _Path(moe, up, n1, _fit_row(moe, moe_params), _fit_row(up, up_params),
                 span or search_range(moe, up)).crossings()[0]


def dstar_samples(moe: FittedLaw, up: FittedLaw, n1: float) -> np.ndarray:
    """D* for every bootstrap pair (sample i of each fit); empty without samples on both sides."""
    return np.array([c.dstar for c in _Path(moe, up, n1, *_sample_rows(moe, up), search_range(moe, up)).crossings()])


def crossings_and_samples(moe: FittedLaw, up: FittedLaw, n1: float) -> tuple[Crossings, np.ndarray]:
    """``crossings`` of the fits and ``dstar_samples``, from one design per law at this N1."""
    ms, us = _sample_rows(moe, up)
    first, *rest = _Path(moe, up, n1, np.vstack([_fit_row(moe), ms]), np.vstack([_fit_row(up), us]),
                         search_range(moe, up)).crossings()
    return first, np.array([c.dstar for c in rest])


def fit_closed_form(n1: np.ndarray, dstar: np.ndarray, reference: float = 1e9) -> dict[str, float]:
    """a, b, c of D* ≈ a·(N1/N0)^(b + c·ln(N1/N0)) (the paper's Eq. 2, N0 = ``reference``) by least squares on
    ln D*."""
    n1, dstar = np.asarray(n1, float), np.asarray(dstar, float)
    ok = np.isfinite(dstar) & (dstar > 0)
    if ok.sum() < 3:
        raise FitError(f"D* is finite at only {int(ok.sum())} model size(s); the closed form needs 3")
    x = np.log(n1[ok] / reference)
    coef, *_ = np.linalg.lstsq(np.column_stack([np.ones_like(x), x, x * x]), np.log(dstar[ok]), rcond=None)
    return {"a": float(np.exp(coef[0])), "b": float(coef[1]), "c": float(coef[2]), "reference": reference}


def closed_form_dstar(cf: dict[str, float], n1: np.ndarray) -> np.ndarray:
    x = np.log(np.asarray(n1, float) / cf.get("reference", 1e9))
    return cf["a"] * np.exp(x * (cf["b"] + cf["c"] * x))


def closed_form_text(cf: dict[str, float]) -> str:
    """The closed form as one formula with its signs written out, e.g. D* ≈ 3.1e+06·(N1/1e+09)^(0.023 − 0.00091·ln
    (N1/1e+09))."""
    ref = f"N1/{cf.get('reference', 1e9):.0e}".replace("e+0", "e").replace("e-0", "e-")
    sign = "−" if cf["c"] < 0 else "+"
    return f"D* ≈ {cf['a']:.3g}·({ref})^({cf['b']:.3g} {sign} {abs(cf['c']):.2g}·ln({ref}))"


def n1_span(moe: FittedLaw, up: FittedLaw) -> tuple[float, float] | None:
    """The model sizes the two fits were trained on (the from-scratch N and the upcycled N1 together)."""
    spans = [s for s in (moe.span("N"), up.span("N1")) if s is not None]
    return (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None


def _distance(value: float, span: tuple[float, float] | None) -> float | None:
    """How many times ``value`` lies outside ``span`` (1 inside it; inf at 0 or infinity); None without a span."""
    if span is None:
        return None
    if not (0 < value < math.inf):
        return math.inf
    return max(span[0] / value, value / span[1], 1.0)


def _worst(*factors: float | None) -> float | None:
    known = [f for f in factors if f is not None]
    return max(known) if known else None


def extrapolation(moe: FittedLaw, up: FittedLaw, n1: float, tokens: dict[str, float],
                  factor: float = EXTRAPOLATION_FACTOR) -> dict[str, Any]:
    """How far an answer at ``n1`` and ``tokens`` (column → value: D of the from-scratch law, D1 and D2 of the
    upcycled) lies from what the fits were trained on: ``n1_factor`` and ``tokens_factor`` (1 inside, k when k times
    beyond an end of a column's trained range, the worst column), ``flagged`` beyond ``factor`` either way, and a
    ``note`` naming each column outside its range."""
    sizes = [("N1", n1, up.span("N1")), ("from-scratch N", n1, moe.span("N"))]
    budgets = [(c if c != "D" else "from-scratch D", v, (moe if c == "D" else up).span(c)) for c, v in tokens.items()]
    far = {name: (v, span, _distance(v, span)) for name, v, span in [*sizes, *budgets]}
    n1_f = _worst(*(far[name][2] for name, _, _ in sizes))
    tok_f = _worst(*(far[name][2] for name, _, _ in budgets))
    if n1_f is None and tok_f is None:
        note = "the fits carry no trained range: how far this lies from the data is unknown"
        return {"n1_factor": None, "tokens_factor": None, "factor": factor, "flagged": False, "note": note}
    parts = [f"{name}={v:.3g} is {f:.3g}x {'above' if v > span[1] else 'below'} the range trained "
             f"({span[0]:.3g}–{span[1]:.3g})" for name, (v, span, f) in far.items() if f is not None and f > 1]
    flagged = any(f is not None and f > factor for f in (n1_f, tok_f))
    note = "; ".join(parts) or "inside the trained range"
    if flagged:
        note = f"extrapolation (more than {factor:g}x beyond the data): {note}"
    return {"n1_factor": n1_f, "tokens_factor": tok_f, "factor": factor, "flagged": flagged, "note": note}


def _key(level: float) -> str:
    return str(round(level * 100))


def intervals(samples: np.ndarray, span: tuple[float, float] | None = None) -> dict[str, dict[str, Any] | None] | None:
    """The 80% and 95% percentile intervals of ``samples`` (keys "80", "95"). An end at 0 or infinity (beyond the
    searched range ``span``: see ``Crossings.dstar``) is open: ``low_open`` / ``high_open`` true and its value null,
    which means unbounded, never missing. An interval wholly beyond the range starts (or ends) at the range's edge.
    None without samples."""
    if not samples.size:
        return None
    out: dict[str, dict[str, Any] | None] = {}
    for level in LEVELS:
        lo, hi = percentile_interval(samples, level)
        if np.isnan(lo) or np.isnan(hi):
            out[_key(level)] = None
            continue
        low_open, high_open = not lo > 0, not np.isfinite(hi)
        if np.isinf(lo):  # every sample above the range: D* lies at least at its top
            lo = span[1] if span is not None else None
        if hi == 0:  # every sample below the range
            hi = span[0] if span is not None else None
        out[_key(level)] = {"low": None if low_open else lo, "high": None if high_open else hi,
                            "low_open": low_open, "high_open": high_open}
    return out


def interval_note(samples: np.ndarray, span: tuple[float, float], what: str = "D*") -> str:
    """Words for an interval open at either end: what share of the resamples ran off the searched range and what
    to add; "" when both ends are bounded, and a sentence when there is no interval at all."""
    if not samples.size:
        return "no interval: the analysis ran without bootstrap"
    notes = []
    above, below = float(np.mean(np.isinf(samples))), float(np.mean(samples == 0))
    tail = (1 - LEVELS[-1]) / 2  # more resamples than this beyond an end leave that end of the 95% interval open
    if above > tail:
        notes.append(f"not bounded above by this grid: in {above:.0%} of the bootstrap resamples upcycling still wins "
                     f"at {span[1]:.3g} tokens, so {what} may lie beyond it; add larger D1 and D2 budgets (and "
                     f"from-scratch runs as long) so that the data reach the crossing")
    if below > tail:
        notes.append(f"not bounded below by this grid: in {below:.0%} of the bootstrap resamples from scratch wins "
                     f"over the whole searched range (from {span[0]:.3g} tokens); add smaller D1 and D2 budgets so "
                     f"that the data see where upcycling still wins")
    return "; ".join(notes)


def dstar_at(moe: FittedLaw, up: FittedLaw, n1: float, factor: float = EXTRAPOLATION_FACTOR) -> dict[str, Any]:
    """One N1's entry of the `upscale dstar` JSON: the searched range, every crossing, D* and its state ("crossing";
    "above": upcycling still wins at the range's top, D* lies beyond it; "below": from scratch wins over the whole
    range), who wins where, the 80% and 95% bootstrap intervals with words for an open end, and how far D* lies from
    the data (``extrapolation``: flagged when D* or the far end of its 95% interval lies beyond ``factor``, since a
    D* the data cannot keep within it is no answer about the trained range either). The decision endpoint and the
    refits need only this, not the closed form."""
    check_pair(moe, up)
    if not (math.isfinite(n1) and n1 > 0):
        raise FitError(f"--n1 must be a positive parameter count, got {n1}")
    c, samples = crossings_and_samples(moe, up, n1)
    star = c.dstar
    state = "above" if math.isinf(star) else "below" if star == 0 else "crossing"
    at = {"crossing": star, "above": c.span[1], "below": c.span[0]}[state]
    reach = extrapolation(moe, up, n1, {"D": at, "D1": at, "D2": at}, factor)
    if state != "crossing":
        side = "upcycling still wins at" if state == "above" else "from scratch wins from"
        reach["note"] = f"D* lies beyond the searched range ({side} {at:.3g} tokens); {reach['note']}"
    ivs = intervals(samples, c.span)
    reach |= _interval_reach(moe, up, (ivs or {}).get("95"), factor, reach)
    return {"n1": n1, "search_range": list(c.span), "crossings": list(c.crossings),
            "dstar": star if state == "crossing" else None, "dstar_state": state,
            "intervals": ivs, "interval_note": interval_note(samples, c.span), "extrapolation": reach,
            "segments": [{"from": lo, "to": hi, "wins": side} for lo, hi, side in c.segments]}


def _interval_reach(moe: FittedLaw, up: FittedLaw, iv: dict[str, Any] | None, factor: float,
                    reach: dict[str, Any]) -> dict[str, Any]:
    """``interval_factor``: how far beyond the trained tokens the 95% interval's far end reaches (null when there is
    no interval or the end is open: ``interval_open`` then says which); beyond ``factor``, or open, it flags D* even
    when the estimate itself lies near the data."""
    if iv is None:
        return {"interval_factor": None, "interval_open": False}
    ends = [0.0 if iv["low_open"] else iv["low"], math.inf if iv["high_open"] else iv["high"]]
    spans = (moe.span("D"), up.span("D1"), up.span("D2"))  # as extrapolation's tokens_factor, without its notes
    far = _worst(*(_distance(e, span) for e in ends for span in spans))
    is_open = bool(iv["low_open"] or iv["high_open"])
    out: dict[str, Any] = {"interval_factor": None if is_open else far, "interval_open": is_open}
    if far is not None and far > factor and not reach["flagged"]:
        where = "is open (unbounded)" if is_open else f"reaches {far:.3g}x beyond the budgets trained"
        out |= {"flagged": True, "note": f"extrapolation: D*'s 95% interval {where}, so the data do not keep D* "
                                         f"within {factor:g}x of them; {reach['note']}"}
    return out


def dstar_results(moe: FittedLaw, up: FittedLaw, n1s: list[float], factor: float = EXTRAPOLATION_FACTOR,
                  n1_range: tuple[float, float] | None = None) -> dict[str, Any]:
    """The `upscale dstar` JSON for fitted laws (the CLI and the analysis): ``dstar_at`` for every N1 of ``n1s``
    and the closed form D*(N1), fitted over ``n1_range`` (default the sizes the fits were trained on, else
    N1_RANGE) whichever ``n1s`` were asked, so that it is one formula per pair of fits; null, with the reason in
    ``closed_form_note``, where fewer than 3 of 16 sizes there have a D* inside the searched range."""
    check_pair(moe, up)
    results = [dstar_at(moe, up, n1, factor) for n1 in n1s]
    lo, hi = n1_range or n1_span(moe, up) or N1_RANGE
    closed, note = None, ""
    if hi <= lo:
        note = f"one model size trained ({lo:.3g}): D*(N1) needs several"
    else:
        grid = np.geomspace(lo, hi, 16)
        try:
            closed = fit_closed_form(grid, np.array([crossings(moe, up, n).dstar for n in grid]),
                                     float(10 ** np.round(np.log10(np.sqrt(lo * hi)))))
        except FitError as e:
            note = str(e)
        else:
            closed |= {"n1_range": [lo, hi], "formula": closed_form_text(closed)}
    return {"results": results, "closed_form": closed, "closed_form_note": note}


def _upcycled_tokens(d1: float | np.ndarray, d2: float | np.ndarray) -> dict[str, np.ndarray]:
    d1, d2 = np.broadcast_arrays(np.atleast_1d(np.asarray(d1, float)), np.atleast_1d(np.asarray(d2, float)))
    return {"D1": d1, "D2": d2}


def _catch_up(moe: _Curve, row: int, target: float) -> float:
    """Tokens where the MoE law of parameter row ``row`` reaches the loss ``target`` (see ``catch_up``)."""

    def f(log_d: float) -> float:
        return moe.loss(moe.design({"D": np.atleast_1d(np.exp(log_d))}), row)[0] - target

    lo, hi = np.log(1.0), np.log(TOKEN_RANGE[1] * 1e4)
    if f(hi) > 0:
        return float("inf")
    if f(lo) < 0:
        return 0.0
    return float(np.exp(brentq(f, lo, hi, xtol=1e-12)))


def catch_up(moe: FittedLaw, up: FittedLaw, n1: float, d1: float, d2: float,
             moe_params: dict[str, float] | None = None, up_params: dict[str, float] | None = None) -> float:
    """Tokens D_MoE with L_MoE(N1, D_MoE) = L_upcycled(D1, D2, N1); inf when from scratch never gets there."""
    upcycled = _Curve(up.law, "N1", n1, _fit_row(up, up_params))
    target = upcycled.loss(upcycled.design(_upcycled_tokens(d1, d2)), 0)[0]
    return _catch_up(_Curve(moe.law, "N", n1, _fit_row(moe, moe_params)), 0, target)


@dataclass(frozen=True)
class Limits:
    """Where a law's answer means anything at all: the loss of an untrained model (ln of the vocabulary size: no law
    can predict a loss above it) and one optimizer batch of tokens (no budget is smaller). None where unknown."""

    initial_loss: float | None = None
    batch_tokens: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return {"initial_loss": self.initial_loss, "batch_tokens": self.batch_tokens}


class OutOfRange(FitError):
    """An answer outside the law's sane region (a loss above the untrained model's, a budget under one batch): the
    law has nothing to say there, and the message says why and what range the data cover."""


@dataclass(frozen=True, repr=False)
class UpcycleDecision:
    """A verdict for one (N1, D1, D2): the catch-up budget and, with bootstrap samples, its probability and
    intervals, and how far the question lies from the data. Printed, one line (fitting/display.py)."""

    n1: float
    d1: float
    d2: float
    loss_upcycled: float
    catch_up_tokens: float  # inf: from scratch never reaches the upcycled loss
    verdict: str  # "upcycle" | "scratch" | "undecided" (bootstrap probability between the DECISIVE thresholds)
    probability_upcycle: float | None  # share of bootstrap pairs with D_MoE > D1
    catch_up_samples: np.ndarray
    extrapolation: dict[str, Any]
    decisive: float = DECISIVE

    def to_json(self) -> dict:
        return {"n1": self.n1, "d1": self.d1, "d2": self.d2, "loss_upcycled": self.loss_upcycled,
                "catch_up_tokens": finite_or_none(self.catch_up_tokens),
                "catch_up_state": "never" if math.isinf(self.catch_up_tokens) else "reached",
                "tokens_saved": finite_or_none(self.catch_up_tokens - self.d2),
                "verdict": self.verdict, "probability_upcycle": self.probability_upcycle, "decisive": self.decisive,
                "catch_up_intervals": intervals(self.catch_up_samples), "extrapolation": self.extrapolation}

    def __repr__(self) -> str:
        return display.decision_line(self.to_json())

    def _repr_html_(self) -> str:
        return f"<p>{html.escape(repr(self))}</p>"


def _verdict(d_moe: float, d1: float, probability: float | None, decisive: float) -> str:
    """From the bootstrap when there is one: "upcycle" with at least ``decisive`` of the pairs behind it, "scratch"
    with at most 1 − ``decisive``, else "undecided"; without, the fits' own answer."""
    if probability is None:
        return "upcycle" if d_moe > d1 else "scratch"
    return "upcycle" if probability >= decisive else "scratch" if probability <= 1 - decisive else "undecided"


def _check_sane(loss: float, d_moe: float, limits: Limits, where: str, reach: dict[str, Any]) -> None:
    if limits.initial_loss is not None and not loss < limits.initial_loss:
        raise OutOfRange(f"the upcycled law predicts a loss of {loss:.4g} {where}, not below the untrained model's "
                         f"{limits.initial_loss:.4g} (ln of the vocabulary): the law has left the region where it "
                         f"means anything; {reach['note']}")
    if limits.batch_tokens is not None and d_moe < limits.batch_tokens:
        raise OutOfRange(f"from scratch would match the upcycled loss {where} after {d_moe:.4g} tokens, less than one "
                         f"batch ({limits.batch_tokens:.4g} tokens): the law has left the region where it means "
                         f"anything; {reach['note']}")


def decide(moe: FittedLaw, up: FittedLaw, n1: float, d1: float, d2: float, limits: Limits | None = None,
           factor: float = EXTRAPOLATION_FACTOR, decisive: float = DECISIVE) -> UpcycleDecision:
    """Upcycle or train from scratch, for a dense model of N1 parameters trained on D1 tokens and D2 to spend.
    OutOfRange when the fits' answer leaves ``limits``; beyond ``factor`` from the data it is flagged, not refused."""
    check_pair(moe, up)
    for name, v in (("--n1", n1), ("--d1", d1), ("--d2", d2)):
        if not (np.isfinite(v) and v > 0):
            raise FitError(f"{name} must be a positive number, got {v}")
    ms, us = _sample_rows(moe, up)
    scratch = _Curve(moe.law, "N", n1, np.vstack([_fit_row(moe), ms]))  # row 0 the fits, then the bootstrap pairs
    upcycled = _Curve(up.law, "N1", n1, np.vstack([_fit_row(up), us]))
    X = upcycled.design(_upcycled_tokens(d1, d2))
    # one product per row (not one for all): the targets, and so the budgets, are catch_up's to the bit
    budgets = [_catch_up(scratch, r, upcycled.loss(X, r)[0]) for r in range(len(upcycled.theta))]
    d_moe, samples = budgets[0], np.array(budgets[1:])
    loss = float(upcycled.loss(X, 0)[0])
    reach = extrapolation(moe, up, n1, {"D1": d1, "D2": d2, **({"D": d_moe} if math.isfinite(d_moe) else {})}, factor)
    _check_sane(loss, d_moe, limits or Limits(), f"at N1={n1:.3g}, D1={d1:.3g}, D2={d2:.3g}", reach)
    prob = float(np.mean(samples > d1)) if samples.size else None
    return UpcycleDecision(n1, d1, d2, loss, d_moe, _verdict(d_moe, d1, prob, decisive), prob, samples, reach,
                           decisive)
