"""The answer about D*, honest beyond the law: the runs first, then what the weighed forms project, how far, and how
well such projections held when tried on the runs already there (docs/laws.md, "The answer beyond one law").

For one upcycling group, at every size asked:

1. the observed bracket (fitting/observed.py): D* lies above the largest budget where upcycling leads beyond noise
   and below the first where it trails;
2. each pair of forms (fitting/forms.py, a from-scratch form and an upcycled one, weighted by the product of their
   backtest weights: fitting/bands.py) gives its D*, its search stopped where a form turns (fitting/projection.py);
3. the projected D* is where the stacked predictions (the weights' mean of the forms' log losses) cross;
4. the interval at 80% and 95% is the hull of (a) the forms' bootstrap D* samples mixed by weight and (b) where the
   two arms' calibrated bands separate: the last budget where upcycling leads by more than the bands' root sum of
   squares (the arms' errors taken as independent), to the first where it trails by more; never by less than the
   largest error the stacked projection makes on this size's own matched runs (the gap, not each arm's loss,
   decides D*). Where the bands overlap to the end of the range searched (or of the range
   where the forms hold), that end is open, said in words with the runs that would close it;
5. the runs bound it: the interval is cut to the observed bracket, and a projected D* outside the bracket is
   replaced by the bracket, flagged "the law contradicts the runs at …".

``next`` names the pair of runs that would most narrow D*: the budget inside the interval where the forms'
projected gaps disagree most.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from upscale.fitting.backtest import distance, dstar_backtest, run_backtests
from upscale.fitting.bands import LEVELS, Calibration, backtest_record, calibrate
from upscale.fitting.dstar import OutOfRange
from upscale.fitting.form_fits import FormFit, fit_forms, with_samples
from upscale.fitting.forms import PRIMARY, form, path_columns, turned
from upscale.fitting.observed import Z_BY_LEVEL, Observed, observe
from upscale.fitting.projection import FormPath, first_dstar, form_path, pair_dstar, tokens_grid

MIN_WEIGHT = 0.01  # a form below this weight takes no part in the stacked prediction or the mixture


@dataclass(frozen=True)
class Words:
    """How an answer names the arm that starts ahead: a dense model upcycled to an MoE, or an MoE grown to more
    experts (fitting/expansion.py). Kept in the record by ``name``, so that an answer made again at any size (the
    decision endpoints) says the same."""

    name: str
    lead: str  # "upcycling ahead"
    runs: str  # "upcycled runs"
    verdict: str  # the verdict for that arm: "upcycle"
    dstar: str  # the threshold's name: "D*"

    def said(self, verdict: str | None) -> str | None:
        """A verdict as this arm's answers say it (the laws' "upcycle" is an expansion's "expand")."""
        return self.verdict if verdict == UPCYCLING.verdict else verdict


UPCYCLING = Words("upcycling", "upcycling", "upcycled", "upcycle", "D*")
EXPANSION = Words("expansion", "expanding", "expanded", "expand", "D*_expand")
WORDS = {w.name: w for w in (UPCYCLING, EXPANSION)}


def _key(level: float) -> str:
    return str(round(level * 100))


def weighted_interval(values: np.ndarray, weights: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` interval of weighted samples (inf and 0 count as the extremes they are)."""
    ok = ~np.isnan(values)
    v, w = values[ok], weights[ok]
    if not v.size or w.sum() <= 0:
        return math.nan, math.nan
    order = np.argsort(v, kind="stable")
    v, cw = v[order], np.cumsum(w[order]) / w.sum()
    tail = (1 - level) / 2
    return float(v[np.searchsorted(cw, tail)]), float(v[min(np.searchsorted(cw, 1 - tail), v.size - 1)])


def _as_interval(lo: float | None, hi: float | None) -> dict[str, Any]:
    """{low, high, low_open, high_open}: an end at 0, inf or None is open (unbounded), never missing."""
    low_open = lo is None or not lo > 0 or not math.isfinite(lo)
    high_open = hi is None or not math.isfinite(hi)
    return {"low": None if low_open else lo, "high": None if high_open else hi,
            "low_open": low_open, "high_open": high_open}


def _hull(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    if a is None or b is None:
        return a or b
    lo = None if a["low_open"] or b["low_open"] else min(a["low"], b["low"])
    hi = None if a["high_open"] or b["high_open"] else max(a["high"], b["high"])
    return _as_interval(lo, hi)


@dataclass(frozen=True)
class Arms:
    """The whole grid's forms of both arms, their weights and the calibrated bands."""

    fits: Mapping[str, Mapping[str, FormFit]]
    calibration: Calibration

    def weighted(self, arm: str) -> list[tuple[FormFit, float]]:
        w = self.calibration.weights[arm]
        return [(self.fits[arm][f], v) for f, v in w.items() if v >= MIN_WEIGHT and f in self.fits[arm]]

    def budgets(self) -> tuple[float, float]:
        """The smallest and the largest upcycled budget (D1 or D2) trained."""
        spans = [v for ff in self.fits["upcycled"].values() for c, v in ff.trained.items() if c in ("D1", "D2")]
        return min(v[0] for v in spans), max(v[1] for v in spans)

    def distance(self, arm: str, n1: float, tokens: np.ndarray) -> np.ndarray:
        """Decades beyond the trained range of every point of the path (the worst column)."""
        return distance(path_columns(arm, n1, tokens), next(iter(self.fits[arm].values())).trained)

    def paths(self, n1: float, tokens: np.ndarray) -> dict[str, dict[str, FormPath]]:
        """Every fitted form's path at ``n1`` (its fit's parameters): arm → form → path, computed once per size."""
        return {arm: {name: form_path(ff.form, ff.row(), n1, tokens) for name, ff in fits.items()}
                for arm, fits in self.fits.items()}

    def stacked(self, arm: str, paths: Mapping[str, FormPath]) -> tuple[np.ndarray, np.ndarray]:
        """The stacked log loss along the path, each point from the weighted forms that still hold there (have not
        turned), their weights renormalised; and where any does (past that, no form of the arm speaks)."""
        parts = self.weighted(arm)
        logs = np.array([paths[ff.form.name].log_loss[:, 0] for ff, _ in parts])  # (form, point)
        holds = np.array([~paths[ff.form.name].turned[:, 0] for ff, _ in parts]) & np.isfinite(logs)
        w = np.array([v for _, v in parts])[:, None] * holds
        total = w.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            log_loss = np.where(total > 0, (w * np.where(holds, logs, 0.0)).sum(axis=0) / total, np.nan)
        return log_loss, total > 0


def _band_interval(gap: np.ndarray, margin: np.ndarray, valid: np.ndarray, tokens: np.ndarray,
                   led: float | None = None) -> tuple[float | None, float | None]:
    """Where the bands cannot tell the arms apart after upcycling's lead: from the end of the first stretch of
    budgets where upcycling leads by more than ``margin`` to the first budget after it where it trails by more, within
    ``valid`` points. A trail before any lead (far below the data, where the upcycled law blows up) is not D*: see
    ``dstar.Crossings.dstar``; nor is one at or below ``led``, the largest budget where the runs show upcycling
    ahead beyond noise (the runs overrule the bands there). None where an end does not exist (open)."""
    stop = int(np.argmin(valid)) if not valid.all() else len(tokens)
    lead, trail = gap[:stop] > margin[:stop], gap[:stop] < -margin[:stop]
    low = None
    start = 0
    if lead.any():
        first = int(np.argmax(lead))
        after = np.flatnonzero(~lead[first:])
        end = first + int(after[0]) if after.size else stop
        low, start = float(tokens[end - 1]), end
    if led is not None:
        start = max(start, int(np.searchsorted(tokens, led, side="right")))
    later = np.flatnonzero(trail[start:])
    high = float(tokens[start + int(later[0])]) if later.size else None
    return low, high


def _mixture_samples(arms: Arms, n1: float, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """D* of the forms' bootstrap samples, each pair's samples weighted so that the pair counts by its weight."""
    sides = {arm: [(ff, w, form_path(ff.form, ff.samples, n1, tokens)) for ff, w in arms.weighted(arm)
                   if len(ff.samples)] for arm in ("scratch", "upcycled")}
    values, weights = [], []
    for s, ws, ps in sides["scratch"]:
        for u, wu, pu in sides["upcycled"]:
            n = min(len(s.samples), len(u.samples))
            cut = [FormPath(p.log_loss[:, :n], p.turned[:, :n]) for p in (ps, pu)]
            values.append(pair_dstar(*cut, tokens).dstar)
            weights.append(np.full(n, ws * wu / n))
    if not values:
        return np.empty(0), np.empty(0)
    return np.concatenate(values), np.concatenate(weights)


def _pair_dstars(arms: Arms, paths: Mapping[str, Mapping[str, FormPath]], tokens: np.ndarray) -> list[dict[str, Any]]:
    """Every pair of fitted forms: its D* along ``tokens``, its weight and where its search stopped."""
    weights = arms.calibration.weights
    out = []
    for s, ps in paths["scratch"].items():
        for u, pu in paths["upcycled"].items():
            p = pair_dstar(ps, pu, tokens)
            star, stop = float(p.dstar[0]), float(p.stopped_at[0])
            out.append({"scratch": s, "upcycled": u,
                        "weight": weights["scratch"].get(s, 0.0) * weights["upcycled"].get(u, 0.0),
                        "dstar": star if 0 < star < math.inf else None,
                        "state": "crossing" if 0 < star < math.inf else "above" if star == math.inf
                        else "below" if star == 0 else "none",
                        "stopped_at": stop if math.isfinite(stop) else None})
    return out


def answer_at(arms: Arms, observed: Observed, n1: float, span: tuple[float, float],
              words: Words = UPCYCLING) -> dict[str, Any]:
    """The answer about D* at ``n1``: see the module docstring. ``span``: the range searched."""
    tokens = tokens_grid(span)
    paths = arms.paths(n1, tokens)
    ls, holds_s = arms.stacked("scratch", paths["scratch"])
    lu, holds_u = arms.stacked("upcycled", paths["upcycled"])
    valid = holds_s & holds_u & np.isfinite(ls) & np.isfinite(lu)
    gap = ls - lu
    star = float(first_dstar(gap[:, None], valid[:, None], tokens)[0])
    end = float(tokens[int(np.argmin(valid))]) if not valid.all() else span[1]
    d_s, d_u = arms.distance("scratch", n1, tokens), arms.distance("upcycled", n1, tokens)
    values, weights = _mixture_samples(arms, n1, tokens)
    bracket = observed.bracket(n1)
    b_lo, b_hi = (bracket["low"], bracket["high"]) if bracket else (None, None)
    sd = observed.noise["sd"]
    floor = _gap_floor(arms, observed, n1, sd)
    intervals, band_ivs, mixture_ivs, brackets = {}, {}, {}, {}
    for level in LEVELS:
        cut = brackets[_key(level)] = observed.bracket(n1, Z_BY_LEVEL[level])
        c_lo, c_hi = (cut["low"], cut["high"]) if cut else (None, None)
        margin = np.maximum(floor, np.hypot(arms.calibration.half_width("scratch", d_s, level, sd),  # independent
                                            arms.calibration.half_width("upcycled", d_u, level, sd)))  # arms
        band_ivs[_key(level)] = _as_interval(*_band_interval(gap, margin, valid, tokens, c_lo))
        if values.size:
            lo, hi = weighted_interval(values, weights, level)
            mixture_ivs[_key(level)] = _as_interval(lo, hi)
        iv = _hull(band_ivs[_key(level)], mixture_ivs.get(_key(level)))
        intervals[_key(level)] = _bounded(iv, c_lo, c_hi)
    contradiction = _contradiction(star, b_lo, b_hi, n1, words)
    state = "crossing" if 0 < star < math.inf else "above" if star == math.inf else "below" if star == 0 else "none"
    if contradiction:
        state = "observed"
    pairs = _pair_dstars(arms, paths, tokens)
    weighted_pairs = [p for p in pairs if p["weight"] >= MIN_WEIGHT and p["dstar"] is not None]
    spread = ([min(p["dstar"] for p in weighted_pairs), max(p["dstar"] for p in weighted_pairs)]
              if weighted_pairs else None)
    shown = star if state == "crossing" else None
    return {"dstar": shown, "dstar_state": state, "projected_dstar": star if 0 < star < math.inf else None,
            "intervals": intervals, "band_intervals": band_ivs, "mixture_intervals": mixture_ivs or None,
            "forms": pairs, "spread": spread, "valid_to": end if end < span[1] else None,
            "observed_bracket": bracket, "interval_brackets": brackets, "contradiction": contradiction,
            "open_note": _open_note(intervals["80"], n1, span, end, bracket, words, arms.budgets()[1]),
            "distance": _reach(shown, state, intervals["80"], arms, n1, words),
            "next": _next_pair(arms, paths, n1, tokens, valid, intervals["80"], words)}


def _gap_floor(arms: Arms, observed: Observed, n1: float, noise: float) -> float:
    """The largest error the stacked projection makes on this size's own matched diagonal pairs, in log gap, less
    the two runs' point noise ``noise`` in quadrature (a pair's gap carries it, the mean gap does not): the bands
    are never narrower than that, since the gap itself, not each arm's loss, decides D* (0 without pairs)."""
    pairs = [p for p in observed.pairs if p["diagonal"] and math.isclose(p["n1"], n1, rel_tol=1e-9)]
    if not pairs:
        return 0.0
    tokens = np.array([p["d1"] for p in pairs])
    paths = arms.paths(n1, tokens)
    ls, hs = arms.stacked("scratch", paths["scratch"])
    lu, hu = arms.stacked("upcycled", paths["upcycled"])
    errors = [abs(g - p["log_gap"]) for g, p, ok in zip(ls - lu, pairs, hs & hu, strict=True) if ok]
    return math.sqrt(max(max(errors, default=0.0) ** 2 - 2 * noise ** 2, 0.0))


def _bounded(iv: dict[str, Any] | None, lo: float | None, hi: float | None) -> dict[str, Any]:
    """``iv`` cut to the observed bracket [lo, hi]; the bracket itself where they do not meet."""
    if iv is None:
        return _as_interval(lo, hi)
    low = iv["low"] if not iv["low_open"] else None
    high = iv["high"] if not iv["high_open"] else None
    if lo is not None:
        low = lo if low is None or low < lo else low
    if hi is not None:
        high = hi if high is None or high > hi else high
    if low is not None and high is not None and low > high:
        return _as_interval(lo, hi)
    return _as_interval(low, high)


def _contradiction(star: float, lo: float | None, hi: float | None, n1: float, words: Words) -> str:
    """Words when the projected D* lies outside the observed bracket, naming the runs it contradicts ("" when no
    form holds at this size: there is no projection to contradict)."""
    if math.isnan(star):
        return ""
    if lo is not None and not star > lo:
        where = "has from scratch ahead" if star > 0 else "has from scratch ahead everywhere"
        return (f"the law contradicts the runs at N1={n1:.3g}: it {where} below {lo:.3g} tokens"
                f"{f' ({words.dstar} {star:.3g})' if 0 < star < math.inf else ''}, where the runs show {words.lead} "
                f"ahead beyond noise; {words.dstar} lies above {lo:.3g}")
    if hi is not None and not star < hi:
        return (f"the law contradicts the runs at N1={n1:.3g}: it has {words.lead} still ahead at {hi:.3g} tokens, "
                f"where the runs show from scratch ahead beyond noise; {words.dstar} lies below {hi:.3g}")
    return ""


def _open_note(iv: dict[str, Any], n1: float, span: tuple[float, float], end: float,
               bracket: dict[str, Any] | None, words: Words, top: float) -> str:
    """Why an end of the 80% interval is open, and the pair of runs that would close it: beyond the runs' lead, or
    without a bracket at this size, beyond ``top``, the largest budget trained."""
    notes = []
    if iv["high_open"]:
        top = (bracket or {}).get("low") or top
        why = (f"the forms stop holding at {end:.3g} tokens (a loss that no longer falls with tokens)"
               if end < span[1] else f"the calibrated bands overlap up to {span[1]:.3g} tokens, the end of the range "
                                     f"searched")
        notes.append(f"open above: {why}; {words.runs} (D1 = D2 = D) and from-scratch runs at N1={n1:.3g} beyond "
                     f"{max(top, span[0]):.3g} tokens would close it")
    if iv["low_open"]:
        notes.append(f"open below: the runs and the bands cannot tell {words.lead} ahead at any budget from "
                     f"{span[0]:.3g} tokens; {words.runs} and from-scratch runs at N1={n1:.3g} at smaller budgets "
                     f"would close it")
    return "; ".join(notes)


def _reach(star: float | None, state: str, iv: dict[str, Any], arms: Arms, n1: float,
           words: Words) -> dict[str, Any]:
    """How far the answer is projected: the D* and the 80% interval's far end, as factors beyond the largest (or
    below the smallest) budget trained, in words."""
    lo, hi = arms.budgets()

    def factor(v: float | None) -> float | None:
        return None if v is None else max(v / hi, lo / v, 1.0)

    f_star = factor(star)
    f_far = math.inf if iv["high_open"] else factor(iv["high"])
    note = {"observed": f"the runs bound {words.dstar} (the projection contradicts them)",
            "above": f"the projection has {words.lead} ahead to the end of the range searched",
            "below": "the projection has from scratch ahead over the whole range searched",
            "none": "no projection holds at this size"}.get(state, "")
    if f_star is not None:
        note = (f"{words.dstar} inside the budgets trained" if f_star <= 1 else
                f"{words.dstar} projected {f_star:.2g}x {'beyond' if star > hi else 'below'} the budgets trained")
    note += ("; the interval is open above" if iv["high_open"]
             else f"; the interval reaches {f_far:.2g}x" if f_far and f_far > 1 else "")
    return {"dstar_factor": f_star, "interval_factor": None if f_far == math.inf else f_far, "note": note,
            "trained_tokens": [lo, hi], "n1": n1}


NEXT_REACH = 8.0  # the next pair of runs is looked for at most this far beyond the largest budget trained


def _next_pair(arms: Arms, paths: Mapping[str, Mapping[str, FormPath]], n1: float, tokens: np.ndarray,
               valid: np.ndarray, iv: dict[str, Any], words: Words) -> dict[str, Any]:
    """The budget inside the 80% interval where the weighted forms' projected gaps disagree most, no further than
    ``NEXT_REACH`` beyond the largest budget trained (a run there is affordable and its answer still narrows the
    interval from its low end): train upcycled at D1 = D2 = D and from scratch at D there."""
    top = arms.budgets()[1]
    lo = iv["low"] if not iv["low_open"] else tokens[0]
    hi = min(iv["high"] if not iv["high_open"] else tokens[-1], NEXT_REACH * top)
    inside = valid & (tokens >= lo * (1 - 1e-9)) & (tokens <= hi * (1 + 1e-9))
    if not inside.any():
        return {}
    gaps, weights = [], []
    for s, ws in arms.weighted("scratch"):
        for u, wu in arms.weighted("upcycled"):
            gaps.append(paths["scratch"][s.form.name].log_loss[:, 0] - paths["upcycled"][u.form.name].log_loss[:, 0])
            weights.append(ws * wu)
    g, w = np.array(gaps), np.array(weights)[:, None]
    mean = (w * g).sum(axis=0) / w.sum()
    sd = np.sqrt((w * (g - mean) ** 2).sum(axis=0) / w.sum())
    sd[~inside] = -1.0
    i = int(np.argmax(sd))
    d = float(tokens[i])
    return {"n1": n1, "tokens": d, "forms_sd": float(sd[i]),
            "runs": f"{words.runs} at N1={n1:.3g}, D1 = D2 = {d:.3g} tokens, and from scratch at N1={n1:.3g}, "
                    f"D = {d:.3g} tokens",
            "flops": 6.0 * n1 * 3 * d}  # 6·N·tokens for the dense D1, the MoE D2 and the from-scratch D


def verdict_from_runs(verdict: dict[str, Any], observed: Observed, words: Words = UPCYCLING) -> dict[str, Any]:
    """A verdict at a point the runs measured: the runs' answer stands where they differ beyond noise, and a law
    that says otherwise is flagged."""
    pair = observed.pair(verdict["n1"], verdict["d1"], verdict["d2"])
    if pair is None:
        return {**verdict, "observed": None}
    out = {**verdict, "observed": {k: pair[k] for k in ("loss_upcycled", "loss_scratch", "log_gap", "noise",
                                                        "leader")}}
    if pair["leader"] == "tie" or verdict.get("verdict") in (None, pair["leader"]):
        return out
    return {**out, "law_verdict": verdict.get("verdict"), "verdict": pair["leader"],
            "contradiction": f"the law contradicts the runs at N1={pair['n1']:.3g}, D1={pair['d1']:.3g}, "
                             f"D2={pair['d2']:.3g}: it says {words.said(verdict.get('verdict'))}, the runs show "
                             f"{words.lead if pair['leader'] == 'upcycle' else 'from scratch'} ahead by "
                             f"{abs(pair['log_gap']):.1%} (noise {pair['noise']:.1%}); the runs' answer stands"}




@dataclass(frozen=True)
class GroupAnswer:
    """What one upcycling group's answers rest on, kept in the record so that an answer at any size (the decision
    endpoint) is made the same way as the analysis's: the forms' fits, weights and bands, the runs' pairs, the
    backtests, and the range searched."""

    arms: Arms
    observed: Observed
    backtest: dict[str, Any]
    span: tuple[float, float]
    failed: dict[str, dict[str, str]]
    words: Words = UPCYCLING

    def at(self, n1: float) -> dict[str, Any]:
        return answer_at(self.arms, self.observed, n1, self.span, self.words)

    def check_point(self, n1: float, d1: float, d2: float) -> None:
        """OutOfRange (a 422 at the decision endpoint) when every weighted form of an arm has turned at this
        question's point: no form the backtests trust can speak there. A point merely far from the data is
        answered, its distance named."""
        for arm, at, tokens in (("upcycled", d1, d2), ("scratch", None, d1)):
            parts = self.arms.weighted(arm)
            if parts and all(turned(ff.form, ff.row(), n1, np.array([tokens]), at)[0, 0] for ff, _ in parts):
                names = ", ".join(ff.form.name for ff, _ in parts)
                raise OutOfRange(f"every {arm} law form the backtests weigh ({names}) has stopped falling with "
                                 f"tokens at N1={n1:.3g}, D1={d1:.3g}, D2={d2:.3g}: none means anything there")

    def to_json(self) -> dict[str, Any]:
        forms = {arm: {name: {"params": f.params, "samples": f.samples.tolist(), "rms": f.rms,
                              "trained": {c: list(v) for c, v in f.trained.items()}}
                       for name, f in fits.items()} for arm, fits in self.arms.fits.items()}
        return {"forms": forms, "failed_forms": self.failed, "calibration": self.arms.calibration.to_json(),
                "observed": self.observed.to_json(), "backtest": self.backtest, "span": list(self.span),
                "words": self.words.name}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GroupAnswer:
        fits = {arm: {name: FormFit(form(arm, name), dict(f["params"]),
                                    np.asarray(f["samples"], dtype=float).reshape(-1, len(f["params"])), f["rms"],
                                    {c: tuple(v) for c, v in f["trained"].items()})
                      for name, f in forms.items()} for arm, forms in data["forms"].items()}
        c = data["calibration"]
        calibration = Calibration(c["weights"], c["sigma0"], c["growth_per_decade"],
                                  {k: math.inf if v is None else v for k, v in c["quantiles"].items()},
                                  c["n_scores"], c["calibrated"])
        o = data["observed"]
        observed = Observed(o["pairs"], o["noise"], {b["n1"]: {k: v for k, v in b.items() if k != "n1"}
                                                     for b in o["brackets"]})
        return cls(Arms(fits, calibration), observed, data["backtest"], tuple(data["span"]), data["failed_forms"],
                   WORDS[data.get("words", UPCYCLING.name)])


def answer_group(tables: Mapping[str, pd.DataFrame], n1s: Sequence[float], span: tuple[float, float],
                 primary: Mapping[str, tuple[dict[str, float], np.ndarray]], E: float,
                 E_draws: Sequence[dict[str, float] | None] | None, bootstrap: int,
                 seed: int, words: Words = UPCYCLING) -> tuple[GroupAnswer, list[dict[str, Any]]]:
    """Fit every form of both arms on ``tables`` (one upcycling group; ``primary``: the analysis's own fits of
    the paper's forms, arm → (params, samples)), backtest and weigh them, and answer at every size of ``n1s``."""
    full, failed = {}, {}
    for arm, table in (("scratch", tables["scratch"]), ("upcycled", tables["upcycled"])):
        full[arm], failed[arm] = fit_forms(arm, table, E, known={PRIMARY[arm]: primary[arm]})
    backtests = run_backtests(tables, full, E)
    calibration = calibrate(backtests, full, seed)
    weighed = {arm: [f for f, w in calibration.weights[arm].items() if w >= MIN_WEIGHT] for arm in calibration.weights}
    dstar_rows = dstar_backtest(backtests, full, [(s, u) for s in weighed["scratch"] for u in weighed["upcycled"]],
                                n1s, span)
    for arm, table in (("scratch", tables["scratch"]), ("upcycled", tables["upcycled"])):
        for name, w in calibration.weights[arm].items():
            if w >= MIN_WEIGHT and not full[arm][name].form.saturating:
                full[arm][name] = with_samples(full[arm][name], table, math.ceil(bootstrap * w), seed, E_draws)
        if "joint-saturating" in full[arm]:  # Eq. 12's fit and samples
            joint = full[arm]["joint"]
            full[arm]["joint-saturating"] = replace(full[arm]["joint-saturating"], samples=joint.samples)
    group = GroupAnswer(Arms(full, calibration), observe(tables["scratch"], tables["upcycled"]),
                        backtest_record(backtests, calibration, dstar_rows), span, failed, words)
    return group, [group.at(n1) for n1 in n1s]


def merge_answer(result: dict[str, Any], answer: dict[str, Any]) -> None:
    """One size's D* entry (fitting/dstar.py ``dstar_at``) made the answer's: ``dstar``, ``dstar_state``,
    ``intervals`` and ``interval_note`` become the answer's, the paper's single pair of laws kept beside them as
    ``law_dstar``, ``law_dstar_state``, ``parameter_intervals`` and ``parameter_interval_note``; the rest of the
    answer under ``answer``."""
    result.update({"law_dstar": result["dstar"], "law_dstar_state": result["dstar_state"],
                   "parameter_intervals": result["intervals"], "parameter_interval_note": result["interval_note"],
                   "dstar": answer["dstar"], "dstar_state": answer["dstar_state"], "intervals": answer["intervals"],
                   "interval_note": answer["open_note"],
                   "answer": {k: v for k, v in answer.items()
                              if k not in ("dstar", "dstar_state", "intervals", "open_note")}})


def answer_problems(answers: Sequence[dict[str, Any]], fit: str, words: Words = UPCYCLING) -> list[dict[str, Any]]:
    """The record's problems the answers found: a law that contradicts the runs, and the paper's pair of laws
    turning inside the range searched (not used past that point)."""
    out = []
    for a in answers:
        n1 = a["distance"]["n1"]
        if a["contradiction"]:
            out.append({"law": "joint", "fit": fit, "kind": "contradiction", "n1": n1, "why": a["contradiction"],
                        "add": f"{words.runs} and from-scratch runs at the budgets the bracket leaves open"})
        paper = next((p for p in a["forms"] if (p["scratch"], p["upcycled"]) == (PRIMARY["scratch"],
                                                                              PRIMARY["upcycled"])), None)
        if paper and paper["stopped_at"] is not None:
            top = a["distance"]["trained_tokens"][1]
            out.append({"law": "joint", "fit": fit, "kind": "monotone", "n1": n1,
                        "why": f"the paper's laws stop falling with tokens past {paper['stopped_at']:.3g} tokens at "
                               f"N1={n1:.3g} ({paper['stopped_at'] / top:.2g}x the largest budget trained): they are "
                               f"not used there, the other forms answer beyond it",
                        "add": "runs past that budget, so that the form is fitted where it would turn"})
    return out


def size_independent(up: Any, moe: Any, n1: float, d1: float, d2: float) -> str:
    """Words when neither fitted law depends on size at this point any more (a size term driven to nothing, such as
    B = 3e115 with beta = 25.8): then no size can be told from another and no verdict speaks to N1; "" otherwise."""
    h = 1e-3
    slopes = []
    for fitted, cols in ((up, {"D1": d1, "D2": d2, "N1": n1}), (moe, {"D": d1, "N": n1})):
        size = "N1" if "N1" in cols else "N"
        at = {c: np.array([v]) for c, v in cols.items()}
        moved = {**at, size: at[size] * np.exp(h)}
        slopes.append(abs(float(np.log(fitted.law.predict(fitted.params, moved)[0])
                                - np.log(fitted.law.predict(fitted.params, at)[0]))) / h)
    if max(slopes) > 1e-6:
        return ""
    return (f"the fitted laws no longer depend on model size at N1={n1:.3g} (d log L / d log N1 below 1e-6 for both): "
            f"the same loss at every size, so this is no verdict about N1; add sizes that pin the size term down")
