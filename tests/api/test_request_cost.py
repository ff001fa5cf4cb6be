"""What one request may cost and what its answer says, on a live server: inline fit rows are capped, leave-one-out
above LOO_HELD_OUT rows is a seeded sample the report names, a bootstrap's draws x rows are capped before any refit,
a key spelled in Unicode digits keeps every field error, numpy's messages never reach a caller, and plot links are
paths on the server, whatever Host the request named. No background loops: nothing trains."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from fastapi import Request

from tests.api.test_limits import SPEC
from upscale.api.app import _value_error
from upscale.control.schemas import LOO_HELD_OUT, MAX_BOOTSTRAP_ROWS, MAX_INLINE_ROWS
from upscale.fitting.laws import get_law
from upscale.fitting.synthetic import TABLE2, design, generate


def _rows(n_d2: int) -> list[dict]:
    """Synthetic upcycled observations: 2 N1 x 3 D1 x ``n_d2`` D2."""
    joint = get_law("joint")
    grid = {"N1": (1e8, 1e9), "D1": (1e9, 4e9, 1.6e10), "D2": tuple(np.geomspace(1e9, 1.6e10, n_d2))}
    rows = generate(joint, TABLE2["upcycled"], design(joint, grid), noise=0.003, seed=4)
    return json.loads(rows.drop(columns="trunk").to_json(orient="records"))


def test_inline_rows_past_the_cap_are_refused_and_nothing_is_stored(live) -> None:
    row = {"N1": 1e8, "D1": 1e9, "D2": 1e9, "loss": 3.0}
    with live.client() as c:
        before = len(c.get("/fits").json())
        r = c.post("/fits", json={"law": "joint", "kind": "upcycled", "rows": [row] * (MAX_INLINE_ROWS + 1)})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "rows"], r.text[:500]
        assert f"at most {MAX_INLINE_ROWS} items" in r.json()["detail"][0]["msg"]
        rows = _rows(100)  # 600 rows x 500 draws: the bootstrap cap is checked before any refit
        r = c.post("/fits", json={"law": "joint", "kind": "upcycled", "rows": rows, "bootstrap": 500})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "rows"], r.text
        assert f"use bootstrap <= {MAX_BOOTSTRAP_ROWS // len(rows)}" in r.json()["detail"][0]["msg"]
        assert len(c.get("/fits").json()) == before


def test_a_large_fit_samples_its_loo_and_links_plots_by_path(live) -> None:
    rows = _rows(50)
    assert len(rows) > LOO_HELD_OUT
    with live.client() as c:
        r = c.post("/fits", json={"law": "joint", "kind": "upcycled", "fixed": {"E": 0.165}, "rows": rows},
                   headers={"Host": "attacker.example"})
        assert r.status_code == 201, r.text
        fit = r.json()
        assert fit["report"]["loo_sampled"] == LOO_HELD_OUT and fit["report"]["loo_rms"] is not None
        assert f"seeded sample of {LOO_HELD_OUT} of the {len(rows)} rows" in " ".join(fit["report"]["warnings"])
        assert fit["plots"] and all(url == f"/fits/{fit['id']}/plots/{name}.png" for name, url in fit["plots"].items())
        listed = c.get(f"/fits/{fit['id']}", headers={"Host": "attacker.example"}).json()
        assert listed["plots"] == fit["plots"]
        assert c.get(fit["plots"]["parity"]).content.startswith(b"\x89PNG")


def test_a_unicode_digit_key_keeps_every_field_error(live) -> None:
    """"²" and "١" are digits to str.isdigit; as keys they are names, and the other problems are still listed."""
    body = {**SPEC, "per_size": {"²": {"batch_size": 8}, "١": {"batch_size": 8}},
            "train": {**SPEC["train"], "context": 0}, "tokens": {"d1": [-1], "d2": [128]}}
    with live.client() as c:
        r = c.post("/sweeps", json=body)
    assert r.status_code == 422, r.text
    locs = [d["loc"] for d in r.json()["detail"]]
    assert ["body", "train", "context"] in locs and ["body", "tokens", "d1", 0] in locs
    body = {**SPEC, "per_size": {"²": {"batch_size": 8}, "١": {"batch_size": 8}}}
    with live.client() as c:
        r = c.post("/sweeps", json=body)
    assert r.status_code == 422 and [d["loc"] for d in r.json()["detail"]] == [["body", "per_size", "²"],
                                                                               ["body", "per_size", "١"]], r.text


def test_sizes_too_small_for_the_arithmetic_are_refused_by_their_bound(live) -> None:
    """A denormal N1 passed `> 0` and reached numpy's geomspace ("Geometric sequence cannot include zero"): every
    N1 and token count is now at least 1."""
    with live.client() as c:
        r = c.post("/sweeps/0123456789ab/analysis", json={"n1s": [5e-324]})
        assert r.status_code == 422 and "[1, 1e+18]" in r.text and "Geometric" not in r.text, r.text
        r = c.get("/decisions/upcycle", params={"n1": 5e-324, "d1": 1e9, "d2": 1e9})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "n1"], r.text
        r = c.post("/sweeps/0123456789ab/suggest", json={"budget_flops": 1e15, "n1": 5e-324})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "n1"], r.text


def test_a_library_value_error_is_a_422_without_its_message(live) -> None:
    """Whatever ValueError a library raises past the bounds, its message is an internal's: the 422 says what to
    check instead. Upscale's own value errors keep theirs."""
    request = Request({"type": "http", "method": "POST", "path": "/x", "headers": [], "query_string": b""})
    with pytest.raises(ValueError) as numpy_error:
        np.geomspace(0, 1, 3)
    answer = asyncio.run(_value_error(request, numpy_error.value))
    assert answer.status_code == 422 and b"Geometric" not in answer.body and b"bounds the API documents" in answer.body
    from upscale.sweeps.sizes import shape_of

    with pytest.raises(ValueError) as ours:
        shape_of("huge")
    assert b"unknown model size 'huge'" in asyncio.run(_value_error(request, ours.value)).body
