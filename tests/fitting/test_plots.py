"""Every plot of docs/laws.md is written as a real PNG (signature and a non-trivial size)."""

import numpy as np

from upscale.fitting import plots
from upscale.fitting.diagnostics import alpha_d1
from upscale.fitting.laws import get_law
from upscale.fitting.summary import FittedLaw
from upscale.fitting.synthetic import TABLE2, design, generate

PNG = b"\x89PNG\r\n\x1a\n"


def test_every_plot_is_a_png(tmp_path):
    joint = get_law("joint")
    up = FittedLaw(joint, TABLE2["upcycled"])
    moe = FittedLaw(get_law("chinchilla"), TABLE2["moe"])
    grid = {"N1": (1e8, 1e9), "D1": (1e9, 1e10, 1e11), "D2": tuple(np.geomspace(1e8, 1e11, 5))}
    df = generate(joint, TABLE2["upcycled"], design(joint, grid), noise=0.003)
    n1 = np.geomspace(1e8, 1e11, 5)
    paths = [
        plots.parity(up, df, tmp_path / "parity.png"),
        plots.residuals(up, df, tmp_path / "residuals.png"),
        plots.loss_vs_d2(up, df, tmp_path / "loss.png"),
        plots.alpha_diagnostics(alpha_d1(df, E=0.165), tmp_path / "alpha.png"),
        plots.dstar_band(n1, 3e9 * (n1 / 1e9) ** -0.7, 2e9 * (n1 / 1e9) ** -0.7, 4e9 * (n1 / 1e9) ** -0.7,
                         {"a": 3e9, "b": -0.7, "c": 0.0}, tmp_path / "dstar.png"),
        plots.catch_up_curves(moe, up, [1e9, 7e9], [1e10, 1e11], tmp_path / "catch.png"),
    ]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == PNG and len(data) > 5_000, p
