"""POST /fits on a grid too small for one of its diagnostics (alpha(D1) needs 3+ D2 per D1): the fit is still made
and stored (201), the skipped plot is one warning in the report, and the plots it could draw are served."""

from __future__ import annotations

import json

from upscale.fitting.laws import get_law
from upscale.fitting.synthetic import TABLE2, design, generate


def test_a_diagnostic_the_grid_cannot_support_never_fails_the_fit(live) -> None:
    joint = get_law("joint")
    grid = {"N1": (1e8, 1e9), "D1": (1e9, 4e9, 1.6e10), "D2": (1e9, 4e9)}
    rows = generate(joint, TABLE2["upcycled"], design(joint, grid), noise=0.003, seed=4)
    body = {"law": "joint", "kind": "upcycled", "fixed": {"E": 0.165},
            "rows": json.loads(rows.drop(columns="trunk").to_json(orient="records"))}
    with live.client() as c:
        r = c.post("/fits", json=body)
        assert r.status_code == 201, r.text
        fit = r.json()
        assert set(fit["plots"]) == {"parity", "residuals", "loss_vs_d2"}
        skipped = [w for w in fit["report"]["warnings"] if w.startswith("plot ")]
        assert skipped == ["plot alpha_d1 skipped: the alpha(D1) diagnostic needs at least 2 D1 values with more "
                           "than 2 points each"]
        assert c.get(f"/fits/{fit['id']}").json()["report"]["warnings"] == fit["report"]["warnings"]
        png = c.get(fit["plots"]["loss_vs_d2"])
        assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    folder = live.settings.home / "fits" / fit["id"]
    assert (folder / "loss_vs_d2.pdf").read_bytes()[:5] == b"%PDF-" and not list(folder.glob("alpha_d1*"))
