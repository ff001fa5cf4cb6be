"""The PNG plots of docs/laws.md ("Plots"), one function each; every one returns the path it wrote.

matplotlib with the Agg backend (no display needed; imported here, not at package import, so that fitting
stays light for callers that never plot). Figures are closed after saving so long runs do not leak memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from upscale.fitting.diagnostics import AlphaDiagnostics, alpha_d1
from upscale.fitting.dstar import closed_form_dstar, moe_loss, upcycled_loss
from upscale.fitting.laws import LOSS, get_law
from upscale.fitting.summary import FittedLaw


def _save(fig: plt.Figure, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def parity(fitted: FittedLaw, df: pd.DataFrame, path: str | Path) -> Path:
    """Fitted against observed loss; points on the diagonal are fitted exactly."""
    pred = fitted.law.predict(fitted.params, df)
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.scatter(df[LOSS], pred, s=12)
    lo, hi = float(min(df[LOSS].min(), pred.min())), float(max(df[LOSS].max(), pred.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set(xlabel="observed loss", ylabel="fitted loss", title=f"{fitted.law.name}: fitted vs observed")
    return _save(fig, path)


def residuals(fitted: FittedLaw, df: pd.DataFrame, path: str | Path) -> Path:
    """Relative residuals against the law's holdout column: a trend means the form misses something."""
    pred = fitted.law.predict(fitted.params, df)
    col = fitted.law.holdout
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.scatter(df[col], 100 * (df[LOSS] - pred) / pred, s=12)
    ax.axhline(0, color="k", lw=1)
    ax.set(xscale="log", xlabel=col, ylabel="residual (%)", title=f"{fitted.law.name}: residuals")
    return _save(fig, path)


def loss_vs_d2(fitted: FittedLaw, df: pd.DataFrame, path: str | Path) -> Path:
    """Observed loss against D2, one colour per D1, with the fitted curves (one panel per N1 when present)."""
    n1s = sorted(df["N1"].unique()) if "N1" in df.columns else [None]
    fig, axes = plt.subplots(1, len(n1s), figsize=(3.6 * len(n1s), 3.6), squeeze=False, sharey=True)
    d2 = np.geomspace(max(df["D2"][df["D2"] > 0].min(), 1.0), df["D2"].max(), 100)
    for ax, n1 in zip(axes[0], n1s, strict=True):
        part = df if n1 is None else df[df["N1"] == n1]
        for i, (d1, g) in enumerate(part.groupby("D1", sort=True)):
            c = f"C{i % 10}"
            ax.scatter(g["D2"], g[LOSS], s=10, color=c, label=f"D1={d1:.2g}")
            curve = {"D1": np.full_like(d2, d1), "D2": d2}
            if n1 is not None:
                curve["N1"] = np.full_like(d2, n1)
            ax.plot(d2, fitted.law.predict(fitted.params, pd.DataFrame(curve)), color=c, lw=1)
        ax.set(xscale="log", xlabel="D2 (tokens)", title="" if n1 is None else f"N1={n1:.3g}")
    axes[0][0].set_ylabel("loss")
    axes[0][0].legend(fontsize=6)
    return _save(fig, path)


def alpha_diagnostics(diag: AlphaDiagnostics, path: str | Path) -> Path:
    """α(D1) and A(D1) per slice with their fitted trends (Fig. 4, Eq. 16)."""
    s = diag.slices
    x = np.geomspace(s["D1"].min(), s["D1"].max(), 50)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.5))
    a1.scatter(s["D1"], s["alpha"], s=14)
    a1.plot(x, -(diag.gamma * np.log(x) + diag.e_prime), "k--", lw=1, label=f"gamma={diag.gamma:.2e}")
    a1.set(xscale="log", xlabel="D1 (tokens)", ylabel="alpha(D1)", title="exponent of D2 per sunk cost")
    a1.legend(fontsize=7)
    a2.scatter(s["D1"], s["A"], s=14)
    a2.plot(x, np.exp(diag.log_a0) * x ** -diag.eta, "k--", lw=1, label=f"eta={diag.eta:.3f}")
    a2.set(xscale="log", yscale="log", xlabel="D1 (tokens)", ylabel="A(D1)", title="scale per sunk cost")
    a2.legend(fontsize=7)
    return _save(fig, path)


def dstar_band(n1: np.ndarray, dstar: np.ndarray, lo: np.ndarray | None, hi: np.ndarray | None,
               closed_form: dict[str, float] | None, path: str | Path) -> Path:
    """D*(N1) with its bootstrap band and the closed-form fit: below the curve upcycling wins (Fig. 1 right)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot(n1, dstar, "o-", ms=3, label="D* (numeric)")
    if lo is not None and hi is not None:
        ax.fill_between(n1, lo, hi, alpha=0.25, label="95% bootstrap interval")
    if closed_form:
        ax.plot(n1, closed_form_dstar(closed_form, n1), "r--", lw=1,
                label="a={a:.2g}, b={b:.2f}, c={c:.3f}".format(**closed_form))
    ax.set(xscale="log", yscale="log", xlabel="N1 (dense parameters)", ylabel="D* (tokens)",
           title="upcycling wins below D*")
    ax.legend(fontsize=7)
    return _save(fig, path)


def catch_up_curves(moe: FittedLaw, up: FittedLaw, n1s: list[float], d1s: list[float], path: str | Path,
                    tokens: tuple[float, float] = (1e8, 1e13)) -> Path:
    """Loss against tokens, from scratch (D_MoE) and upcycled (D2) at several sunk costs (Fig. 15 analogue)."""
    fig, axes = plt.subplots(1, len(n1s), figsize=(3.8 * len(n1s), 3.6), squeeze=False)
    t = np.geomspace(*tokens, 120)
    for ax, n1 in zip(axes[0], n1s, strict=True):
        ax.plot(t, moe_loss(moe, n1, t), "k-", lw=1.5, label="MoE from scratch")
        for i, d1 in enumerate(d1s):
            ax.plot(t, upcycled_loss(up, n1, np.full_like(t, d1), t), f"C{i % 10}--", lw=1,
                    label=f"upcycled, D1={d1:.1g}")
        ax.set(xscale="log", xlabel="tokens (D_MoE or D2)", title=f"N1={n1:.2g}")
    axes[0][0].set_ylabel("loss")
    axes[0][0].legend(fontsize=6)
    return _save(fig, path)


def fit_plots(law_name: str, rep: dict[str, Any], df: pd.DataFrame, out: Path) -> list[Path]:
    """The plots of one fit report (parity, residuals; loss vs D2 and alpha(D1) for data laws), written to ``out``:
    `upscale fit --plot` and the API's fits."""
    law = get_law(law_name)
    fitted = FittedLaw(law, rep["params"])
    paths = [parity(fitted, df, out / "parity.png"), residuals(fitted, df, out / "residuals.png")]
    if {"D1", "D2"} <= set(law.columns):
        paths.append(loss_vs_d2(fitted, df, out / "loss_vs_d2.png"))
        paths.append(alpha_diagnostics(alpha_d1(df, E=rep["params"].get("E")), out / "alpha_d1.png"))
    return paths
