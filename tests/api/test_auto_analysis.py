"""From sweep to answer with nothing but a submission: a real server (uvicorn, embedded Ray, SQLite) trains a tiny
3-size sweep for real, its analysis loop analyses the sweep once it is done, and GET /decisions/upcycle answers 200
with a verdict and a bootstrap probability, naming that analysis, with no POST /fits. Slow: it trains every
segment of the grid on the machine's cores (minutes)."""

from __future__ import annotations

import pytest

from tests.api.conftest import serve
from tests.api.test_flow import wait_for
from upscale.orchestrator.settings import Settings

# Tiny shapes, 3 sizes; three from-scratch budgets, so the from-scratch law is identified (with two, the analysis
# says so and the decision is a 409 naming the budget to add); naive upcycling at 2 D1 x 3 D2.
SPEC = """
name: auto-analysis
model: {sizes: [{n_layer: 1, d_model: 16, n_head: 2}, {n_layer: 1, d_model: 24, n_head: 2}, nano]}
moe: {experts: [4], topk: [2]}
upcycling: {methods: [naive]}
tokens: {d1: [1024, 2048], d2: [512, 1024, 2048], scratch: [1024, 2048, 4096]}
train: {context: 16, batch_size: 8, lr: {dense: 3.0e-3, moe: 2.0e-3}, warmup_tokens: 256}
data: {corpus: "builtin:python-stdlib", tokenizer: bytes, eval_tokens: 2048}
resources: {cpus: 1}
"""


@pytest.mark.slow
def test_a_finished_sweep_answers_the_decision_without_any_fit_posted(tmp_path, mlflow_uri, ray_session) -> None:
    settings = Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)
    with serve(settings, poll_s=0.2, refit_tick_s=0.5, analysis_tick_s=0.5) as live:
        c = live.client()
        sid = c.post("/sweeps", content=SPEC, headers={"content-type": "application/yaml"}).json()["id"]
        early = c.get("/decisions/upcycle", params={"n1": 1e5, "d1": 2048, "d2": 1024})
        assert early.status_code == 409 and "/fits" not in early.text  # says what is missing, not what to post
        detail = wait_for(lambda: (d := c.get(f"/sweeps/{sid}").json())["status"] in ("done", "failed") and d,
                          1500, "the sweep to finish")
        assert detail["status"] == "done", detail

        def answered():
            r = c.get("/decisions/upcycle", params={"n1": 1e5, "d1": 2048, "d2": 1024, "sweep_id": sid})
            assert r.status_code in (200, 409), r.text
            return r.json() if r.status_code == 200 else None

        d = wait_for(answered, 600, "the automatic analysis")
        assert d["verdict"] in ("upcycle", "scratch") and 0 <= d["probability_upcycle"] <= 1
        assert d["analysis"]["sweep_ids"] == [sid] and d["analysis"]["age_s"] >= 0 and d["group"] == "naive 4x2"
        analysis = c.get(f"/sweeps/{sid}/analysis").json()
        assert analysis["id"] == d["analysis"]["id"] and analysis["trigger"] == "completed"
        assert analysis["params"]["bootstrap"] > 0
        assert c.get("/fits").json() == []  # nothing was fitted by hand
