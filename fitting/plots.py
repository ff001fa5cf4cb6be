"""The plots of docs/laws.md ("Plots"): one primitive per figure, each written as PNG and PDF (the PDF for a paper),
and ``fit_plots``, the diagnostics of one fit report (`upscale fit --plot`, POST /fits). fitting/analysis_plots.py
draws a whole analysis with the same primitives.

matplotlib with the Agg backend (no display needed; imported here, not at package import, so that fitting stays
light for callers that never plot). Every figure is closed, also when drawing fails, so long runs do not leak
memory. A diagnostic the data cannot support (``DrawnPlots.attempt``) is skipped with its reason, never raised: a
plot is optional, the fit it illustrates is not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from upscale.fitting.bootstrap import CI_LEVEL, percentile_interval
from upscale.fitting.curve_observations import is_predicted
from upscale.fitting.diagnostics import AlphaDiagnostics, alpha_d1
from upscale.fitting.dstar import (
    EXTRAPOLATION_FACTOR,
    LEVELS,
    closed_form_dstar,
    crossings_and_samples,
    moe_loss,
    n1_span,
    upcycled_loss,
)
from upscale.fitting.errors import FitError
from upscale.fitting.laws import LOSS, get_law
from upscale.fitting.summary import FittedLaw

FORMATS = ("png", "pdf")
BAND = f"{CI_LEVEL:.0%} bootstrap interval"
PANEL_COLUMNS = 3  # panels per row before a grid wraps
STYLE = {"font.size": 9, "axes.titlesize": 9, "legend.fontsize": 8, "axes.grid": True, "grid.alpha": 0.3,
         "grid.linewidth": 0.5, "savefig.dpi": 150}
AXIS = {"D": "$D$ (training tokens)", "N": "$N$ (parameters)", "D1": "$D_1$ (dense tokens, sunk cost)",
        "D2": "$D_2$ (upcycling tokens)", "N1": "$N_1$ (dense parameters)", "P": "$P$ (granularity)",
        "N2": "$N_2$ (MoE parameters)"}
OBSERVED = {"marker": "o", "s": 14, "edgecolor": "white", "linewidth": 0.4, "zorder": 3}
PREDICTED = {"marker": "o", "s": 16, "facecolor": "none", "linewidth": 0.9, "zorder": 3}  # hollow: from a curve


@dataclass
class DrawnPlots:
    """What a set of plots wrote: ``names`` are stems relative to the output folder (each written as ``.png`` and
    ``.pdf``), ``skipped`` one line per plot the data cannot support, saying which and why."""

    names: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def attempt(self, out: Path, name: str, draw: Callable[[Path], object]) -> None:
        """``draw(out / name)``; a FitError or ValueError (a grid too small, nothing finite to put on a log axis)
        skips the plot with its reason instead of raising."""
        try:
            draw(out / name)
        except ValueError as e:  # FitError is one
            self.skip(name, str(e))
        else:
            self.names.append(name)

    def skip(self, name: str, why: str) -> None:
        self.skipped.append(f"{name}: {why}")

    def warnings(self) -> list[str]:
        """The skipped plots as warning lines, `plot NAME skipped: WHY`: what the CLI prints and a fit report keeps."""
        return [f"plot {name} skipped: {why}" for name, _, why in (line.partition(": ") for line in self.skipped)]


@contextmanager
def _figure(n_panels: int = 1, panel: tuple[float, float] = (3.6, 3.0), **kw: Any) -> Iterator[tuple[plt.Figure,
                                                                                                      list[plt.Axes]]]:
    """A figure of ``n_panels`` axes wrapped PANEL_COLUMNS to a row (unused cells removed), in the house style;
    closed on the way out whether or not it was saved."""
    cols = min(n_panels, PANEL_COLUMNS)
    rows = math.ceil(n_panels / cols)
    with plt.rc_context(STYLE):
        fig, grid = plt.subplots(rows, cols, figsize=(panel[0] * cols, panel[1] * rows), squeeze=False, **kw)
        try:
            axes = list(grid.flat)
            for ax in axes[n_panels:]:
                ax.remove()
            yield fig, axes[:n_panels]
        finally:
            plt.close(fig)


def _save(fig: plt.Figure, path: str | Path) -> Path:
    """``path`` (a stem; a .png/.pdf suffix is dropped) as PNG and PDF; the PNG's path."""
    p = Path(path)
    stem = p.with_suffix("") if p.suffix in (".png", ".pdf") else p
    stem.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    for fmt in FORMATS:
        fig.savefig(stem.with_name(f"{stem.name}.{fmt}"), bbox_inches="tight")
    return stem.with_name(f"{stem.name}.png")


def _shades(values: Sequence[float]) -> dict[float, Any]:
    """A colour per value, dark to light along viridis, stopping short of its yellow (unreadable on white)."""
    return {v: plt.get_cmap("viridis")(x) for v, x in zip(values, np.linspace(0, 0.85, len(values)), strict=True)}


def _legend_below(fig: plt.Figure, handles: list[Any], ncol: int = 4) -> None:
    """One legend for every panel, under them, so that it covers no data."""
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(ncol, len(handles)),
               frameon=False)


def _log_x(*axes: plt.Axes) -> None:
    """A log x axis whose labels do not collide: under a decade and a half of data matplotlib labels the minor
    ticks too (2×10³ 3×10³ 4×10³ ... overlapping), so label 1, 2 and 5 of each decade instead."""
    for ax in axes:
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
        if hi < 30 * lo:
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${_tex_number(v, 1)}$"))
            ax.xaxis.set_minor_formatter(NullFormatter())


def _tex_number(x: float, digits: int = 2) -> str:
    """``x`` for mathtext: 3.1\\times10^{9} rather than 3.1e+09."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    exp = math.floor(math.log10(abs(x)))
    if -2 <= exp <= 3:
        return f"{float(f'{x:.{digits}g}'):g}"  # 1000 rather than 1e+03
    return rf"{x / 10 ** exp:.{digits}g}\times10^{{{exp}}}"


def _title(fitted: FittedLaw, title: str | None) -> str:
    return title or fitted.law.name


def _relative_residuals(fitted: FittedLaw, df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    pred = np.asarray(fitted.law.predict(fitted.params, df), float)
    return pred, 100 * (df[LOSS].to_numpy(float) - pred) / pred


def parity(fitted: FittedLaw, df: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """Fitted against observed loss; points on the diagonal are fitted exactly."""
    pred, res = _relative_residuals(fitted, df)
    with _figure(panel=(3.8, 3.6)) as (fig, (ax,)):
        ax.scatter(df[LOSS], pred, label=f"observation (RMS residual {np.sqrt(np.mean(res ** 2)):.2g}%)", **OBSERVED)
        lo, hi = float(min(df[LOSS].min(), pred.min())), float(max(df[LOSS].max(), pred.max()))
        pad = 0.03 * (hi - lo or hi)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k--", lw=0.8, label="fitted = observed")
        ax.set(xlabel="observed loss", ylabel="fitted loss", title=f"{_title(fitted, title)}: fitted vs observed",
               aspect="equal")
        ax.legend(loc="upper left")
        return _save(fig, path)


def residuals(fitted: FittedLaw, df: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """Relative residuals against the law's holdout column: a trend means the form misses something."""
    _, res = _relative_residuals(fitted, df)
    col = fitted.law.holdout
    with _figure(panel=(5.0, 3.0)) as (fig, (ax,)):
        ax.scatter(df[col], res, **OBSERVED)
        ax.axhline(0, color="k", lw=0.8)
        ax.set(xlabel=AXIS.get(col, col), ylabel="(observed − fitted) / fitted (%)",
               title=f"{_title(fitted, title)}: residuals")
        _log_x(ax)
        return _save(fig, path)


def _fit_handles(law_name: str, df: pd.DataFrame) -> list[Any]:
    """Legend entries saying what the symbols are (colour says which value of the varied column); hollow markers
    are decay ends predicted from trunk curves, when ``df`` has any."""
    predicted = [Line2D([], [], color="0.4", marker="o", mfc="none", ls="", ms=4,
                        label="predicted from its trunk's curve")] if is_predicted(df).any() else []
    return [Line2D([], [], color="0.4", marker="o", ls="", ms=4, label="observed"), *predicted,
            Line2D([], [], color="0.4", lw=1.2, label=f"fitted ({law_name})")]


def _points(ax: Any, df: pd.DataFrame, x: str, colour: Any) -> None:
    """``df``'s losses against ``x``: observed decays filled, predicted ones hollow."""
    predicted = is_predicted(df)
    ax.scatter(df[x][~predicted], df[LOSS][~predicted], color=colour, **OBSERVED)
    if predicted.any():
        ax.scatter(df[x][predicted], df[LOSS][predicted], edgecolor=colour, **PREDICTED)


def loss_vs_d2(fitted: FittedLaw, df: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """Observed loss against D2, one colour per D1, with the fitted curves: one panel per N1 (wrapped), one legend;
    decay ends predicted from trunk curves (``source`` "predicted") hollow."""
    n1s = sorted(df["N1"].unique()) if "N1" in df.columns else [None]
    d1s = sorted(df["D1"].unique())
    colours = _shades(d1s)
    positive = df["D2"][df["D2"] > 0]
    if positive.empty:
        raise FitError("loss vs D2 needs a positive D2")
    d2 = np.geomspace(max(positive.min(), 1.0), df["D2"].max(), 100)
    with _figure(len(n1s), sharey=True) as (fig, axes):
        for ax, n1 in zip(axes, n1s, strict=True):
            part = df if n1 is None else df[df["N1"] == n1]
            for d1, g in part.groupby("D1", sort=True):
                _points(ax, g, "D2", colours[d1])
                curve = {"D1": np.full_like(d2, d1), "D2": d2}
                if n1 is not None:
                    curve["N1"] = np.full_like(d2, n1)
                ax.plot(d2, fitted.law.predict(fitted.params, pd.DataFrame(curve)), color=colours[d1], lw=1.2)
            ax.set(xlabel=AXIS["D2"], title="" if n1 is None else f"$N_1 = {_tex_number(n1)}$")
            _log_x(ax)
        for ax in axes[::PANEL_COLUMNS]:
            ax.set_ylabel("loss")
        if title:
            fig.suptitle(title)
        handles = [Line2D([], [], color=colours[d1], marker="o", lw=1.2, ms=4, label=f"$D_1 = {_tex_number(d1)}$")
                   for d1 in d1s]
        extra = _fit_handles(fitted.law.name, df)
        _legend_below(fig, handles + extra, ncol=len(handles) + len(extra) if len(d1s) <= 6 else 6)
        return _save(fig, path)


def loss_vs_d(fitted: FittedLaw, df: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """Observed loss against D, one colour per model size N, with the fitted curves (a (D, N) law such as the
    from-scratch or the dense Chinchilla law); predicted decay ends hollow."""
    sizes = sorted(df["N"].unique())
    positive = df["D"][df["D"] > 0]
    if positive.empty:
        raise FitError("loss vs D needs a positive D")
    d = np.geomspace(positive.min(), df["D"].max(), 100)
    with _figure(panel=(5.2, 3.6)) as (fig, (ax,)):
        handles = []
        for n, c in _shades(sizes).items():
            g = df[df["N"] == n]
            _points(ax, g, "D", c)
            ax.plot(d, fitted.law.predict(fitted.params, pd.DataFrame({"D": d, "N": np.full_like(d, n)})),
                    color=c, lw=1.2)
            handles.append(Line2D([], [], color=c, marker="o", lw=1.2, ms=4, label=f"$N = {_tex_number(n)}$"))
        ax.set(xlabel=AXIS["D"], ylabel="loss", title=_title(fitted, title))
        _log_x(ax)
        ax.legend(handles=handles + _fit_handles(fitted.law.name, df), loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  frameon=False)
        return _save(fig, path)


def alpha_diagnostics(diag: AlphaDiagnostics, path: str | Path, title: str | None = None) -> Path:
    """α(D1) and A(D1) per slice with their fitted trends (Fig. 4, Eq. 16)."""
    s = diag.slices
    x = np.geomspace(s["D1"].min(), s["D1"].max(), 50)
    per = r"per-$(N_1, D_1)$" if s["N1"].notna().any() else r"per-$D_1$"
    with _figure(2, panel=(4.2, 3.4)) as (fig, (a1, a2)):
        a1.scatter(s["D1"], s["alpha"], label=rf"{per} fit of $L = A D_2^{{-\alpha}} + E$", **OBSERVED)
        a1.plot(x, -(diag.gamma * np.log(x) + diag.e_prime), "k--", lw=1,
                label=rf"$-\alpha = \gamma \ln D_1 + E'$, $\gamma = {_tex_number(diag.gamma)}$")
        a1.set(xlabel=AXIS["D1"], ylabel=r"$\alpha(D_1)$", title=r"exponent of $D_2$ per sunk cost")
        a1.legend(loc="best")
        a2.scatter(s["D1"], s["A"], label=f"{per} fit", **OBSERVED)
        a2.plot(x, np.exp(diag.log_a0) * x ** -diag.eta, "k--", lw=1,
                label=rf"$A \propto D_1^{{-\eta}}$, $\eta = {diag.eta:.3f}$")
        a2.set(yscale="log" if s["A"].max() > 10 * s["A"].min() else "linear",  # ticks of a decade
               xlabel=AXIS["D1"], ylabel=r"$A(D_1)$", title="scale per sunk cost")
        _log_x(a1, a2)
        a2.legend(loc="best")
        if title:
            fig.suptitle(title)
        return _save(fig, path)


def closed_form_label(cf: dict[str, float]) -> str:
    """The closed form D*(N1) with its fitted numbers, as mathtext (fitting.dstar.fit_closed_form's form)."""
    c = cf["c"]
    power = math.log10(cf.get("reference", 1e9))
    ref = f"N_1/10^{{{round(power)}}}" if power == round(power) else f"N_1/{_tex_number(cf['reference'])}"
    return (rf"$D^* = {_tex_number(cf['a'])}\,({ref})^{{{cf['b']:.3f} {'+' if c >= 0 else '-'} "
            rf"{abs(c):.4f}\,\ln({ref})}}$")


@dataclass(frozen=True)
class DstarCurve:
    """D* over model sizes for one pair of laws: the fits' crossing, the bootstrap interval (None without samples)
    and the closed form fitted to it (None when too few sizes have a finite D*)."""

    label: str
    n1: np.ndarray
    dstar: np.ndarray
    lo: np.ndarray | None
    hi: np.ndarray | None
    closed_form: dict[str, float] | None
    trained_n1: tuple[float, float] | None = None  # the sizes the fits were trained on
    trained_tokens: tuple[float, float] | None = None  # and the token budgets
    lo80: np.ndarray | None = None
    hi80: np.ndarray | None = None


def dstar_curve(moe: FittedLaw, up: FittedLaw, n1: Sequence[float], label: str = "",
                closed_form: dict[str, float] | None = None) -> DstarCurve:
    """D* and its interval at each size of ``n1`` (one design per size for the fit and its bootstrap pairs)."""
    sizes = np.asarray(n1, float)
    central, bands = [], []
    for n in sizes:
        c, samples = crossings_and_samples(moe, up, float(n))
        central.append(c.dstar)
        bands.append([*percentile_interval(samples), *percentile_interval(samples, LEVELS[0])] if samples.size
                     else [np.nan] * 4)
    band = np.array(bands, float)
    has = bool(np.isfinite(band).any())
    return DstarCurve(label, sizes, np.array(central, float), band[:, 0] if has else None, band[:, 1] if has else None,
                      closed_form, n1_span(moe, up), _inside_tokens(moe, up), band[:, 2] if has else None,
                      band[:, 3] if has else None)


def dstar_band(curves: Sequence[DstarCurve], path: str | Path) -> Path:
    """D*(N1) with its 80% and 95% bootstrap bands and the closed-form fit, one colour per upcycling group: below the
    curve upcycling wins (Fig. 1 right). Where D* is infinite (upcycling always wins) a marker sits on the top edge,
    and a band unbounded above (or below: from scratch always wins) runs to the edge. The sizes and budgets trained
    are shaded; a D* more than EXTRAPOLATION_FACTOR outside them is drawn hollow, as an extrapolation."""
    values = np.concatenate([np.asarray(v, float) for c in curves for v in (c.dstar, c.lo, c.hi) if v is not None])
    finite = values[np.isfinite(values) & (values > 0)]
    if not finite.size:
        raise FitError("D* is not finite at any model size (upcycling always, or never, wins): nothing to draw")
    bottom, top = finite.min() / 2, finite.max() * 2
    with _figure(panel=(5.6, 4.0)) as (fig, (ax,)):
        for i, c in enumerate(curves):
            colour = f"C{i % 10}"
            name = f"{c.label}: " if c.label else ""
            shown = np.where(np.isfinite(c.dstar) & (c.dstar > 0), c.dstar, np.nan)
            ax.plot(c.n1, shown, "o-", color=colour, ms=4, lw=1.4, label=f"{name}D* of the fitted laws")
            far = _extrapolated(c, shown)
            if far.any():
                ax.plot(c.n1[far], shown[far], "o", color=colour, mfc="white", ms=6, zorder=4,
                        label=f"{name}extrapolated (> {EXTRAPOLATION_FACTOR:g}x beyond the data)")
            always = np.isinf(c.dstar)
            if always.any():
                ax.plot(c.n1[always], np.full(always.sum(), top), "^", color=colour, ms=6, clip_on=False,
                        label=rf"{name}upcycling always wins ($D^* = \infty$)")
            if c.lo is not None and c.hi is not None:
                ax.fill_between(c.n1, np.clip(c.lo, bottom, top), np.clip(c.hi, bottom, top), color=colour,
                                alpha=0.15, lw=0, label=f"{name}{BAND}")
            if c.lo80 is not None and c.hi80 is not None:
                ax.fill_between(c.n1, np.clip(c.lo80, bottom, top), np.clip(c.hi80, bottom, top), color=colour,
                                alpha=0.25, lw=0, label=f"{name}{LEVELS[0]:.0%} bootstrap interval")
            if c.closed_form:
                n1 = np.geomspace(*c.closed_form.get("n1_range", (c.n1.min(), c.n1.max())), 32)  # where it was fitted
                ax.plot(n1, closed_form_dstar(c.closed_form, n1), "--", color=colour, lw=1,
                        label=f"{name}{closed_form_label(c.closed_form)}")
        _shade_trained(ax, curves[0].trained_n1, curves[0].trained_tokens)
        ax.set(yscale="log", ylim=(bottom, top), xlabel=AXIS["N1"], ylabel="$D^*$ (tokens)",
               title="upcycling wins below $D^*$, training from scratch above")
        _log_x(ax)
        _legend_below(fig, ax.get_legend_handles_labels()[0], ncol=1)
        return _save(fig, path)


def _inside_tokens(moe: FittedLaw, up: FittedLaw) -> tuple[float, float] | None:
    """The token counts inside every trained range D* is measured against (the from-scratch D, D1 and D2 at once):
    where a D* is no extrapolation in tokens."""
    spans = [moe.span("D"), up.span("D1"), up.span("D2")]
    if any(s is None for s in spans):
        return None
    lo, hi = max(s[0] for s in spans), min(s[1] for s in spans)
    return (lo, hi) if lo < hi else None


def _extrapolated(c: DstarCurve, shown: np.ndarray) -> np.ndarray:
    """The sizes whose D* lies more than EXTRAPOLATION_FACTOR outside the trained sizes or budgets."""
    out = np.zeros(len(c.n1), bool)
    for values, span in ((c.n1, c.trained_n1), (shown, c.trained_tokens)):
        if span is not None:
            with np.errstate(invalid="ignore"):
                out |= (values > span[1] * EXTRAPOLATION_FACTOR) | (values < span[0] / EXTRAPOLATION_FACTOR)
    return out


def _shade_trained(ax: plt.Axes, sizes: tuple[float, float] | None, tokens: tuple[float, float] | None) -> None:
    """Grey the model sizes (x) and token budgets (y) the fits were trained on, so an extrapolation shows."""
    if sizes is not None:
        ax.axvspan(*sizes, color="0.5", alpha=0.12, lw=0, label="sizes trained")
    if tokens is not None:
        ax.axhspan(*tokens, color="C2", alpha=0.08, lw=0, label="token budgets trained (D, D1, D2 all inside)")


def _curve_crossings(t: np.ndarray, a: np.ndarray, b: np.ndarray) -> list[tuple[float, float]]:
    """Where curves ``a`` and ``b`` over ``t`` cross (linear in log t between grid points): (tokens, loss)."""
    gap = a - b
    out = []
    for i in np.flatnonzero(np.sign(gap[:-1]) * np.sign(gap[1:]) < 0):
        w = gap[i] / (gap[i] - gap[i + 1])
        x = np.exp(np.log(t[i]) + w * (np.log(t[i + 1]) - np.log(t[i])))
        out.append((float(x), float(a[i] + w * (a[i + 1] - a[i]))))
    return out


def catch_up_curves(moe: FittedLaw, up: FittedLaw, n1s: Sequence[float], d1s: Sequence[float], path: str | Path,
                    tokens: tuple[float, float] = (1e8, 1e13), title: str | None = None) -> Path:
    """Loss against tokens at each N1 (wrapped panels): from scratch (D_MoE), upcycled at several sunk costs D1
    (D2 tokens), and upcycled along D*'s path (D1 = D2), with every crossing with from scratch marked (Fig. 15
    analogue). The path's crossings are D*'s (Eq. 13)."""
    t = np.geomspace(*tokens, 240)
    colours = _shades(d1s)
    with _figure(len(n1s), panel=(3.8, 3.2)) as (fig, axes):
        for ax, n1 in zip(axes, n1s, strict=True):
            scratch = moe_loss(moe, n1, t)
            ax.plot(t, scratch, "k-", lw=1.6)
            curves = [(upcycled_loss(up, n1, np.full_like(t, d1), t), colours[d1], "--") for d1 in d1s]
            curves.append((upcycled_loss(up, n1, t, t), "C3", ":"))
            for loss, colour, style in curves:
                ax.plot(t, loss, style, color=colour, lw=1.3)
                for x, y in _curve_crossings(t, scratch, loss):
                    ax.plot(x, y, "o", ms=6, mfc="white", mec=colour, mew=1.4, zorder=4)
            trained = _inside_tokens(moe, up)
            if trained is not None:
                ax.axvspan(*trained, color="C2", alpha=0.1, lw=0)
            sizes = n1_span(moe, up)
            far = sizes is not None and not sizes[0] / EXTRAPOLATION_FACTOR <= n1 <= sizes[1] * EXTRAPOLATION_FACTOR
            ax.set(xlabel="tokens ($D_{MoE}$ or $D_2$)",
                   title=f"$N_1 = {_tex_number(n1)}$" + (" (extrapolated)" if far else ""))
            _log_x(ax)
        for ax in axes[::PANEL_COLUMNS]:
            ax.set_ylabel("loss")
        if title:
            fig.suptitle(title)
        handles = [Line2D([], [], color="k", lw=1.6, label="MoE from scratch")]
        handles += [Line2D([], [], color=colours[d1], ls="--", lw=1.3, label=f"upcycled, $D_1 = {_tex_number(d1)}$")
                    for d1 in d1s]
        handles += [Line2D([], [], color="C3", ls=":", lw=1.3, label="upcycled with $D_1 = D_2$ (its crossings: D*)"),
                    Line2D([], [], color="0.3", marker="o", mfc="white", ls="", ms=6,
                           label="from scratch catches up (crossing)"),
                    Patch(color="C2", alpha=0.2, label="token budgets trained (D, D1, D2 all inside)")]
        _legend_below(fig, handles, ncol=3)
        return _save(fig, path)


def token_span(fits: tuple[FittedLaw, FittedLaw], n1s: Sequence[float], lo: float, hi: float) -> tuple[float, float]:
    """``(lo, hi)`` widened to show every D* crossing at ``n1s``."""
    from upscale.fitting.dstar import crossings

    xs = [x for n in n1s for x in crossings(*fits, float(n)).crossings]
    return min([lo, *(x / 3 for x in xs)]), max([hi, *(x * 3 for x in xs)])


def fit_plots(law_name: str, rep: dict[str, Any], df: pd.DataFrame, out: Path) -> DrawnPlots:
    """The plots of one fit report (parity, residuals; loss vs D2 and alpha(D1) for data laws, loss vs D for (D, N)
    laws), written to ``out``: `upscale fit --plot` and the API's fits. What the data cannot support is skipped."""
    law = get_law(law_name)
    fitted = FittedLaw(law, rep["params"])
    drawn = DrawnPlots()
    drawn.attempt(out, "parity", lambda p: parity(fitted, df, p))
    drawn.attempt(out, "residuals", lambda p: residuals(fitted, df, p))
    if {"D", "N"} == set(law.columns):
        drawn.attempt(out, "loss_vs_d", lambda p: loss_vs_d(fitted, df, p))
    if {"D1", "D2"} <= set(law.columns):
        drawn.attempt(out, "loss_vs_d2", lambda p: loss_vs_d2(fitted, df, p))
        drawn.attempt(out, "alpha_d1", lambda p: alpha_diagnostics(alpha_d1(df, E=rep["params"].get("E")), p))
    return drawn


def backtest_errors(backtest: dict[str, Any], calibration: dict[str, Any], path: str | Path,
                    title: str | None = None) -> Path:
    """Each form's error on the runs it did not see, against how far beyond its fitted range they lay (a panel per
    arm), with the calibrated 80% and 95% bands of the stacked prediction: how well projections held on this grid,
    and how wide the answer takes them to be further out."""
    points = pd.DataFrame(backtest["points"])
    arms = [a for a in ("scratch", "upcycled") if not points.empty and (points["arm"] == a).any()]
    if not arms:
        raise ValueError(f"no backtest to draw: {backtest.get('note') or 'no held-out runs'}")
    markers = {"budget": "o", "size": "s", "both": "^"}
    with _figure(len(arms), panel=(4.4, 3.4)) as (fig, axes):
        for ax, arm in zip(axes, arms, strict=True):
            mine = points[points["arm"] == arm]
            forms = sorted(mine["form"].unique())
            colours = _shades(list(range(len(forms))))
            reach = max(float(mine["distance"].max()) * 1.5, 0.3)
            d = np.linspace(0, reach, 50)
            scale = np.sqrt(calibration["sigma0"][arm] ** 2 + (calibration["growth_per_decade"][arm] * d) ** 2)
            for level, alpha in (("95", 0.12), ("80", 0.22)):
                q = calibration["quantiles"].get(level)
                if q is not None:
                    ax.fill_between(d, 100 * np.expm1(-q * scale), 100 * np.expm1(q * scale), color="grey",
                                    alpha=alpha, lw=0, label=f"calibrated {level}% band")
            for i, f in enumerate(forms):
                w = calibration["weights"][arm].get(f, 0.0)
                for holdout, part in mine[mine["form"] == f].groupby("holdout"):
                    ax.scatter(part["distance"], 100 * np.expm1(part["log_error"]), s=16, color=colours[i],
                               marker=markers.get(holdout, "o"),
                               label=f"{f} (weight {w:.0%})" if holdout == part["holdout"].iloc[0] else None)
            ax.axhline(0, color="k", lw=0.6)
            ax.set(xlabel="decades beyond the fitted range", ylabel="predicted − observed loss (%)",
                   title=f"{title + ': ' if title else ''}{arm}, held-out runs")
            handles, labels = ax.get_legend_handles_labels()
            seen = dict(zip(labels, handles, strict=True))
            ax.legend(seen.values(), seen.keys(), fontsize=6, loc="best")
        return _save(fig, path)
