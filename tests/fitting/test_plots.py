"""The plots are real files (PNG signature, PDF header) and a diagnostic the data cannot support is skipped with its
reason, never raised: the primitives on a generated grid, fit_plots on a grid too small for alpha(D1), and
draw_analysis on the bundled synthetic tables and on an analysis with no upcycled fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from upscale.fitting import plots
from upscale.fitting.analysis import analyze
from upscale.fitting.analysis_plots import DrawnPlots, draw_analysis
from upscale.fitting.data import read_table
from upscale.fitting.diagnostics import alpha_d1
from upscale.fitting.laws import get_law
from upscale.fitting.summary import FittedLaw
from upscale.fitting.synthetic import TABLE2, bundled_path, design, generate

PNG = b"\x89PNG\r\n\x1a\n"
PDF = b"%PDF-"
GROUP = {"method": "naive", "r": None, "n_expert": 8, "topk": 2}
GROUP_PLOTS = ["loss_vs_d2", "parity", "residuals", "alpha_d1", "backtest", "catch_up"]
SCRATCH_PLOTS = ["scratch_loss_vs_d", "scratch_parity", "scratch_residuals", "dense_loss_vs_d"]


def assert_drawn(out: Path, names: list[str]) -> None:
    """Each name is a real PNG and a real PDF."""
    for name in names:
        png, pdf = (out / f"{name}.{ext}" for ext in ("png", "pdf"))
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5_000, png
        assert pdf.read_bytes()[:5] == PDF and pdf.stat().st_size > 1_000, pdf


@pytest.fixture(scope="module")
def tables() -> dict[str, pd.DataFrame]:
    """The bundled SYNTHETIC tables, the upcycled one as one upcycling group (naive 8x2)."""
    out = {kind: read_table(bundled_path(name)) for kind, name in
           (("dense", "dense"), ("scratch", "moe"), ("upcycled", "upcycled"))}
    out["upcycled"] = out["upcycled"].assign(**GROUP)
    return out


@pytest.mark.slow  # ~8 s on CI's 2 cores (make test stays under 10 minutes)
def test_every_primitive_writes_png_and_pdf(tmp_path: Path) -> None:
    joint = get_law("joint")
    up = FittedLaw(joint, TABLE2["upcycled"])
    moe = FittedLaw(get_law("chinchilla"), TABLE2["moe"])
    grid = {"N1": (1e8, 1e9), "D1": (1e9, 1e10, 1e11), "D2": tuple(np.geomspace(1e8, 1e11, 5))}
    df = generate(joint, TABLE2["upcycled"], design(joint, grid), noise=0.003)
    scratch = generate(moe.law, TABLE2["moe"], design(moe.law, {"N": (1e8, 1e9)}), noise=0.003)
    n1 = np.geomspace(1e8, 1e11, 5)
    curve = plots.DstarCurve("naive 8x2", n1, 3e9 * (n1 / 1e9) ** -0.7, 2e9 * (n1 / 1e9) ** -0.7,
                             np.array([np.inf, *(4e9 * (n1[1:] / 1e9) ** -0.7)]), {"a": 3e9, "b": -0.7, "c": 0.01})
    paths = [
        plots.parity(up, df, tmp_path / "parity"),
        plots.residuals(up, df, tmp_path / "residuals"),
        plots.loss_vs_d2(up, df, tmp_path / "loss_vs_d2"),
        plots.loss_vs_d(moe, scratch, tmp_path / "loss_vs_d"),
        plots.alpha_diagnostics(alpha_d1(df, E=0.165), tmp_path / "alpha"),
        plots.dstar_band([curve], tmp_path / "dstar"),
        plots.catch_up_curves(moe, up, [1e9, 7e9], [1e10, 1e11], tmp_path / "catch"),
    ]
    assert [p.name for p in paths] == ["parity.png", "residuals.png", "loss_vs_d2.png", "loss_vs_d.png",
                                       "alpha.png", "dstar.png", "catch.png"]
    assert_drawn(tmp_path, [p.stem for p in paths])


def test_the_closed_form_is_written_as_a_formula() -> None:
    label = plots.closed_form_label({"a": 3.1e9, "b": -0.7, "c": -0.012})
    assert label == r"$D^* = 3.1\times10^{9}\,(N_1/10^{9})^{-0.700 - 0.0120\,\ln(N_1/10^{9})}$"
    tiny = plots.closed_form_label({"a": 2.7e6, "b": -0.25, "c": 0.063, "reference": 1e5})  # the trained sizes' own
    assert tiny == r"$D^* = 2.7\times10^{6}\,(N_1/10^{5})^{-0.250 + 0.0630\,\ln(N_1/10^{5})}$"


def test_fit_plots_skip_what_a_small_grid_cannot_support(tmp_path: Path) -> None:
    """Two D2 per D1: alpha(D1) has no slice with more points than parameters, the other plots still come."""
    joint = get_law("joint")
    df = generate(joint, TABLE2["upcycled"], design(joint, {"N1": (1e8, 1e9), "D1": (1e9, 4e9), "D2": (1e9, 4e9)}),
                  noise=0.003)
    drawn = plots.fit_plots("joint", {"params": TABLE2["upcycled"]}, df, tmp_path)
    assert drawn.names == ["parity", "residuals", "loss_vs_d2"]
    assert len(drawn.skipped) == 1 and drawn.skipped[0].startswith("alpha_d1: the alpha(D1) diagnostic needs")
    assert_drawn(tmp_path, drawn.names)
    assert not list(tmp_path.glob("alpha_d1*"))


@pytest.mark.slow  # ~19 s on 2 busy cores (make test stays under 10 minutes)
def test_draw_analysis_draws_every_plot_of_the_synthetic_tables(tables: dict[str, pd.DataFrame],
                                                                tmp_path: Path) -> None:
    analysis = analyze(tables, [1e8, 1e9, 7e9], bootstrap=10)
    drawn = draw_analysis(analysis, tables, tmp_path)
    assert isinstance(drawn, DrawnPlots) and drawn.skipped == []
    assert drawn.names == [f"naive_8x2/{n}" for n in GROUP_PLOTS] + ["dstar"] + SCRATCH_PLOTS
    assert_drawn(tmp_path, drawn.names)


def test_draw_analysis_skips_what_the_analysis_has_no_law_for(tables: dict[str, pd.DataFrame],
                                                              tmp_path: Path) -> None:
    """Upcycled runs at one N1 only: no upcycled law, so no group plots and no D*, each skipped with the reason the
    analysis gives; the from-scratch and dense plots are still drawn."""
    one = tables["upcycled"][tables["upcycled"]["N1"] == tables["upcycled"]["N1"].min()]
    degenerate = {**tables, "upcycled": one}
    analysis = analyze(degenerate, bootstrap=0)
    assert analysis.upcycled[0].fit is None
    drawn = draw_analysis(analysis, degenerate, tmp_path)
    assert drawn.names == SCRATCH_PLOTS
    assert_drawn(tmp_path, drawn.names)
    skipped = dict(line.split(": ", 1) for line in drawn.skipped)
    assert list(skipped) == [f"naive_8x2/{n}" for n in GROUP_PLOTS] + ["dstar"]
    assert all("N1 takes 1 value" in why for why in skipped.values()), skipped
    assert not (tmp_path / "naive_8x2").exists() and not (tmp_path / "dstar.png").exists()


@pytest.mark.slow  # ~11 s on 2 busy cores (make test stays under 10 minutes)
def test_draw_analysis_without_from_scratch_runs(tables: dict[str, pd.DataFrame], tmp_path: Path) -> None:
    no_scratch = {**tables, "scratch": tables["scratch"].iloc[0:0]}
    drawn = draw_analysis(analyze(no_scratch, bootstrap=0), no_scratch, tmp_path)
    assert drawn.names == [f"naive_8x2/{n}" for n in GROUP_PLOTS[:4]] + ["dense_loss_vs_d"]
    skipped = [line.split(": ", 1)[0] for line in drawn.skipped]
    assert skipped == ["naive_8x2/backtest", "naive_8x2/catch_up", "dstar", *SCRATCH_PLOTS[:3]]
    assert all("no from-scratch" in line for line in drawn.skipped), drawn.skipped
