"""Where the answer comes from (fitting/dstar.py): D* searched where the data are, every answer's distance from the
trained ranges, extrapolation flagged, answers outside the law's sane region refused, open intervals said in words,
and verdicts without enough bootstrap support undecided. On fixed tables: the paper's laws with the token columns
rescaled so that the true D* at N1 = 1e9 lies at ~1e4 tokens, inside a demo-sized grid."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from upscale.fitting.analysis import Analysis, analyze
from upscale.fitting.dstar import (
    DECISIVE,
    Limits,
    OutOfRange,
    crossings,
    decide,
    dstar_at,
    search_range,
    upcycled_loss,
)
from upscale.fitting.laws import get_law
from upscale.fitting.summary import FittedLaw
from upscale.fitting.synthetic import TABLE2, design, generate

CHIN, JOINT = get_law("chinchilla"), get_law("joint")
N1 = 1e9
TRUE = crossings(FittedLaw(CHIN, TABLE2["moe"]), FittedLaw(JOINT, TABLE2["upcycled"]), N1, span=(1e6, 1e16)).dstar
SCALE = 1e4 / TRUE  # token columns multiplied by this: the true D* at N1 lands at 1e4 tokens


def _rescaled(law_name: str, params: dict[str, float], grid: dict[str, tuple[float, ...]], seed: int) -> pd.DataFrame:
    law = get_law(law_name)
    df = generate(law, params, design(law, grid), noise=0.003, trunk_noise=0.003, seed=seed)
    for c in ("D", "D1", "D2"):
        if c in df.columns:
            df[c] = df[c] * SCALE
    return df


@pytest.fixture(scope="module")
def analysis() -> Analysis:
    sizes = (3e7, 1e8, 3e8, 1e9)
    up_tokens = tuple(np.geomspace(TRUE / 20, TRUE * 20, 5))
    dense_grid = {"D": tuple(np.geomspace(TRUE / 100, TRUE * 1e4, 9)), "N": sizes}
    tables = {"dense": _rescaled("chinchilla", TABLE2["dense"], dense_grid, 5),
              "scratch": _rescaled("chinchilla", TABLE2["moe"], dense_grid, 6),
              "upcycled": _rescaled("joint", TABLE2["upcycled"], {"N1": sizes[1:], "D1": up_tokens,
                                                                  "D2": up_tokens}, 7)}
    return analyze(tables, n1s=[N1], decisions=[(N1, 1e3, 1e3), (1e3, 1.0, 1.0)], bootstrap=40,
                   limits=Limits(math.log(256), 512.0))


def test_a_true_dstar_at_1e4_tokens_is_found_inside_the_grid(analysis: Analysis) -> None:
    (u,) = analysis.upcycled
    (r,) = u.dstar["results"]
    lo, hi = r["search_range"]
    smallest = min(analysis.trained[t][c][0] for t, c in (("scratch", "D"), ("upcycled", "D1"), ("upcycled", "D2")))
    largest = max(analysis.trained[t][c][1] for t, c in (("scratch", "D"), ("upcycled", "D1"), ("upcycled", "D2")))
    assert (lo, hi) == (pytest.approx(max(smallest / 100, 1.0)), pytest.approx(largest * 100))
    assert r["dstar_state"] == "crossing" and 3e3 < r["dstar"] < 3e4  # searched 1e6..1e16 before: never found
    assert not r["extrapolation"]["flagged"] and r["extrapolation"]["tokens_factor"] == 1.0
    ivs = r["intervals"]
    assert ivs["95"]["low"] <= ivs["80"]["low"] < r["dstar"] < ivs["80"]["high"] <= ivs["95"]["high"]
    assert not any(ivs[k][end] for k in ("80", "95") for end in ("low_open", "high_open")) and r["interval_note"] == ""
    cf = u.dstar["closed_form"]
    assert cf is not None and cf["n1_range"] == [3e7, 1e9] and cf["formula"].startswith("D* ≈ ")
    assert ("−" in cf["formula"]) == (cf["c"] < 0) and "+ -" not in cf["formula"]


def test_the_closed_form_is_one_formula_whichever_sizes_are_asked(analysis: Analysis) -> None:
    from upscale.fitting.dstar import dstar_results

    moe, up = analysis.scratch.fitted, analysis.upcycled[0].fit.fitted
    assert dstar_results(moe, up, [1e8])["closed_form"] == dstar_results(moe, up, [1e9, 1e12])["closed_form"]


def test_a_query_1e4_times_beyond_the_grid_is_flagged(analysis: Analysis) -> None:
    far = analysis.decision(1e13, 1e7, 1e7)
    ext = far["extrapolation"]
    assert ext["flagged"] and ext["n1_factor"] == pytest.approx(1e4) and "N1=1e+13 is 1e+04x above" in ext["note"]
    assert far["dstar_extrapolation"]["flagged"]
    near = analysis.decision(N1, 1e4, 1e4)
    assert not near["extrapolation"]["flagged"] and near["extrapolation"]["n1_factor"] == 1.0


def test_answers_outside_the_sane_region_are_refused_with_the_range(analysis: Analysis) -> None:
    """A loss above the untrained model's (ln 256) and a catch-up under one batch: OutOfRange, saying why and what
    the data cover, as the README's example once printed a loss of 27.5 and a catch-up of 13 tokens."""
    moe, up = analysis.scratch.fitted, analysis.upcycled[0].fit.fitted
    assert upcycled_loss(up, 1e3, np.array([1.0]), np.array([1.0]))[0] > math.log(256)  # the case is what it claims
    with pytest.raises(OutOfRange, match=r"above|not below the untrained model's 5\.545.*N1=1e\+03 is"):
        analysis.decision(1e3, 1.0, 1.0)
    tiny = decide(moe, up, N1, 10.0, 10.0)
    assert tiny.catch_up_tokens < 512  # under one batch of the limits given
    with pytest.raises(OutOfRange, match="less than one batch"):
        analysis.decision(N1, 10.0, 10.0)
    asked, refused = analysis.upcycled[0].decisions  # a case asked of the analysis is kept with why it was refused
    assert asked["verdict"] == "upcycle" and refused["verdict"] is None and "untrained model's" in refused["refused"]


def test_a_dstar_beyond_the_searched_range_is_open_in_words() -> None:
    """Upcycling wins everywhere searched: no number, the state says where D* lies, and the interval's open end is
    unbounded (null with its flag) and said in words, never a bare null."""
    never = {**TABLE2["moe"], "A": 1e3}  # from scratch never catches up
    rows = np.tile([never[n] for n in CHIN.param_names], (20, 1))
    spans = {"D": (1e8, 1e10), "N": (1e8, 1e9)}
    moe = FittedLaw(CHIN, never, rows, spans)
    up = FittedLaw(JOINT, TABLE2["upcycled"], np.tile([TABLE2["upcycled"][n] for n in JOINT.param_names], (20, 1)),
                   {"D1": (1e8, 1e10), "D2": (1e8, 1e10), "N1": (1e8, 1e9)})
    assert search_range(moe, up) == (1e6, 1e12)
    r = dstar_at(moe, up, N1)
    assert r["dstar"] is None and r["dstar_state"] == "above" and r["crossings"] == []
    assert r["intervals"]["95"] == {"low": 1e12, "high": None, "low_open": False, "high_open": True}
    assert r["interval_note"].startswith("not bounded above by this grid") and "add larger D1 and D2" in \
        r["interval_note"]
    assert r["extrapolation"]["flagged"] and "beyond the searched range" in r["extrapolation"]["note"]


def test_a_verdict_without_enough_bootstrap_support_is_undecided(analysis: Analysis) -> None:
    """Half the bootstrap pairs one way: "undecided", never "upcycle"."""
    moe, up = analysis.scratch.fitted, analysis.upcycled[0].fit.fitted
    star = crossings(moe, up, N1).dstar
    d = decide(moe, up, N1, star, star)  # at D* the catch-up budget sits at the sunk cost: a coin toss
    assert 1 - DECISIVE < d.probability_upcycle < DECISIVE and d.verdict == "undecided"
    sure = decide(dataclasses.replace(moe, samples=None), dataclasses.replace(up, samples=None), N1, star / 10,
                  star / 10)
    assert sure.verdict in ("upcycle", "scratch") and sure.probability_upcycle is None
