"""Active design on a real SQLite store: `suggest` ranks extensions of a sweep whose observations follow a known law
(the from-scratch law shifted so that D* falls near the grid), each action's marginal FLOPs add up to what the
planner says the applied extension trains, the route's errors (404, 409, 422 at budget_flops) and the console
script's `error:` lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import update

from tests.api.conftest import serve
from upscale.control.analyses import NotReady, run_analysis
from upscale.control.records import AnalysisRecord
from upscale.control.schemas import SuggestRequest
from upscale.control.services import Services
from upscale.control.suggest import MAX_ACTIONS, SuggestError, suggest
from upscale.control.sweeps import merge, submit
from upscale.control.wiring import open_services
from upscale.fitting.laws import get_law
from upscale.fitting.synthetic import TABLE2
from upscale.orchestrator.plan_in_store import compare
from upscale.orchestrator.records import ObservationRecord, SegmentRecord
from upscale.orchestrator.settings import Settings
from upscale.sweeps.planner import plan
from upscale.sweeps.spec import parse_spec

UPSCALE = Path(sys.executable).parent / "upscale"
# Planned, never trained: budgets of millions of tokens put D* (searched from 1e6 tokens on) near the grid.
GRID = {
    "name": "suggest-test",
    "model": {"sizes": [{"n_layer": 1, "d_model": 16, "n_head": 2}, {"n_layer": 1, "d_model": 24, "n_head": 2},
                        {"n_layer": 1, "d_model": 32, "n_head": 2}]},
    "moe": {"experts": [4], "topk": [2]},
    "upcycling": {"methods": ["naive"]},
    "tokens": {"d1": [1e6, 2e6], "d2": [1e6, 2e6, 4e6], "scratch": [1e6, 2e6, 4e6, 8e6]},
    "train": {"context": 16, "batch_size": 8, "lr": {"dense": 3.0e-3, "moe": 2.0e-3}, "warmup_tokens": 256},
    "data": {"corpus": "builtin:python-stdlib", "tokenizer": "bytes", "eval_tokens": 2048},
    "resources": {"cpus": 1},
}
# Table 2's from-scratch law with A lowered 12.5%: D* at the largest size is ~4e6 tokens, inside the grid.
LAWS = {"dense": TABLE2["dense"], "scratch": {**TABLE2["moe"], "A": TABLE2["moe"]["A"] * 0.875},
        "upcycled": TABLE2["upcycled"]}


def _loss(o: dict, rng: np.random.Generator) -> float:
    """The paper's law for the kind (an expanded run's is the upcycled law, an MoE's from scratch the same law
    whatever its experts): so an expansion study's D*_expand is the upcycling's D*."""
    if o["kind"] in ("upcycled", "expanded"):
        law, row = get_law("joint"), {"N1": o["N1"], "D1": o["D1"], "D2": o["D2"]}
    else:
        law, row = get_law("chinchilla"), {"N": o["N1"], "D": o["D"]}
    params = LAWS["upcycled" if o["kind"] == "expanded" else o["kind"]]
    return float(law.predict(params, pd.DataFrame([row]))[0] * np.exp(rng.normal(0, 0.002)))


def fill(services: Services, status: str = "done", grid: dict | None = None) -> str:
    """A submitted sweep with every segment done, an observation per decay, as a scheduler leaves it."""
    sweep_id = submit(services, parse_spec(grid or GRID), "alice", new=True).id
    rng = np.random.default_rng(0)
    members = [seg for seg, _ in services.store.members(sweep_id)]
    with services.store.transaction() as s:
        for seg in members:
            if seg.observation is not None:
                o = seg.observation
                s.add(ObservationRecord(segment_key=seg.key, kind=o["kind"], N1=o.get("N1"), D1=o.get("D1"),
                                        D2=o.get("D2"), D=o.get("D"), N2=o.get("N2"), N_total=o.get("N_total"),
                                        n_expert=o.get("n_expert"), topk=o.get("topk"), method=o.get("method"),
                                        r=o.get("r"), parent_experts=o.get("parent_experts"), loss=_loss(o, rng),
                                        trunk=seg.trunk or seg.key))
        s.execute(update(SegmentRecord).where(SegmentRecord.key.in_([m.key for m in members])).values(status="done"))
    services.store.set_sweep(sweep_id, status=status)
    return sweep_id


pytestmark = pytest.mark.slow  # each test runs suggest's profile refits: ~50-80 s apiece on 2 cores


@pytest.fixture(scope="module")
def analysed(tmp_path_factory, mlflow_uri) -> tuple[Settings, str]:
    settings = Settings(home=tmp_path_factory.mktemp("home"), mlflow_tracking_uri=mlflow_uri)
    services = open_services(settings, auth=False)
    sid = fill(services)
    run_analysis(services, [sid], bootstrap=30, owner="alice", trigger="request")
    return settings, sid


def test_marginal_flops_are_what_the_applied_extension_trains(analysed) -> None:
    settings, sid = analysed
    services = open_services(settings, auth=False)
    ranked = suggest(services, sid, SuggestRequest(budget_flops=1e15), "alice")
    assert ranked.actions and ranked.stopped in ("budget", "no_gain", "limit")
    assert len(ranked.actions) <= MAX_ACTIONS  # each action costs a plan per candidate: a call's work is bounded
    assert ranked.delta_interval[0] < ranked.dstar < ranked.delta_interval[1] and len(ranked.interval) == 2
    lo, hi = ranked.profile_interval  # the weighted refit's D* is near the analysis's, inside its own interval
    assert (lo is None or lo < ranked.dstar) and (hi is None or ranked.dstar < hi) and (lo, hi) != (None, None)
    widths = [a.expected_interval[1] / a.expected_interval[0] for a in ranked.actions]
    assert widths == sorted(widths, reverse=True) and widths[0] < ranked.delta_interval[1] / ranked.delta_interval[0]
    assert all(a.marginal_flops > 0 and a.new_observations > 0 for a in ranked.actions)
    assert ranked.total_flops == pytest.approx(sum(a.marginal_flops for a in ranked.actions))
    merged = merge(services.store.sweep(sid).spec, ranked.additions)
    planned = compare(services.store, plan(parse_spec(merged))).figures()["new_flops"]
    assert ranked.total_flops == pytest.approx(planned, rel=1e-12)

    applied = suggest(services, sid, SuggestRequest(budget_flops=1e15, apply=True), "alice")
    assert [a.additions for a in applied.actions] == [a.additions for a in ranked.actions]
    assert applied.applied is not None and not applied.applied.existing
    assert applied.applied.plan.new_flops == pytest.approx(ranked.total_flops, rel=1e-12)

    cheap = suggest(services, sid, SuggestRequest(budget_flops=ranked.actions[0].marginal_flops), "alice")
    assert [a.additions for a in cheap.actions] == [ranked.actions[0].additions] or cheap.total_flops <= \
        ranked.actions[0].marginal_flops
    with pytest.raises(SuggestError, match="cheapest costs") as e:
        suggest(services, sid, SuggestRequest(budget_flops=1.0), "alice")
    assert e.value.field == "budget_flops"
    now = ranked.delta_interval[1] / ranked.delta_interval[0]
    loose = suggest(services, sid, SuggestRequest(budget_flops=1e15, tolerance=now * 1.01), "alice")
    assert loose.stopped == "tolerance" and loose.actions == []  # already within it
    target = ranked.expected_interval[1] / ranked.expected_interval[0] * 1.0001
    if len(ranked.actions) > 1:  # a tolerance the full budget's actions reach stops there, not before
        tight = suggest(services, sid, SuggestRequest(budget_flops=1e15, tolerance=target), "alice")
        assert tight.stopped == "tolerance" and len(tight.actions) <= len(ranked.actions)


def test_route_errors_and_the_cli(analysed, mlflow_uri) -> None:
    settings, sid = analysed
    with serve(settings, scheduler=False) as live, live.client() as c:
        ok = c.post(f"/sweeps/{sid}/suggest", json={"budget_flops": 1e15})
        assert ok.status_code == 200 and ok.json()["actions"] and ok.json()["applied"] is None
        small = c.post(f"/sweeps/{sid}/suggest", json={"budget_flops": 1.0})
        assert small.status_code == 422 and small.json()["detail"][0]["loc"] == ["body", "budget_flops"]
        assert c.post("/sweeps/nosuch/suggest", json={"budget_flops": 1e15}).status_code == 404
        assert c.post(f"/sweeps/{sid}/suggest", json={"budget_flops": -1}).status_code == 422
        read = c.post(f"/sweeps/{sid}/suggest", json={"budget_flops": 1e15, "apply": True}, headers=live.read)
        assert read.status_code == 403
        services = live.app.state.services
        bare = submit(services, parse_spec({**GRID, "name": "bare", "train": {**GRID["train"], "seed": 1}}),
                      "alice", new=True).id
        none = c.post(f"/sweeps/{bare}/suggest", json={"budget_flops": 1e15})
        assert none.status_code == 409 and "upscale analyze" in none.json()["detail"]
        services.store.request_cancel(bare)
        cancelled = c.post(f"/sweeps/{bare}/suggest", json={"budget_flops": 1e15})
        assert cancelled.status_code == 409 and "cancelled" in cancelled.json()["detail"]
    with pytest.raises(NotReady, match="cancelled"):
        suggest(open_services(settings, auth=False), bare, SuggestRequest(budget_flops=1e15), "alice")

    env = {**os.environ, "UPSCALE_HOME": str(settings.home), "MLFLOW_TRACKING_URI": mlflow_uri,
           "COLUMNS": "200"}
    env.pop("RAY_ADDRESS", None)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(UPSCALE), "suggest", *args], capture_output=True, text=True, env=env, timeout=300)

    shown = cli(sid, "--budget-flops", "1e15")
    assert shown.returncode == 0, shown.stderr
    assert "D* at N1" in shown.stdout and "marginal FLOPs" in shown.stdout and "stopped:" in shown.stdout
    assert "profile likelihood" in shown.stdout
    for args, says in (((sid, "--budget-flops", "1"), "--budget-flops"), ((sid, "--budget-flops", "-5"), "greater"),
                       (("nosuch", "--budget-flops", "1e15"), "nosuch")):
        bad = cli(*args)
        assert bad.returncode == 2 and bad.stderr.startswith("error:") and says in bad.stderr, bad.stderr


def test_trunks_still_training_that_cannot_move_dstar_are_advised_to_stop(tmp_path, mlflow_uri, monkeypatch) -> None:
    """The largest size's largest from-scratch budget left untrained (its decay and the trunk piece only it needs):
    the advice lists exactly the unfinished leaf trunks whose decays shrink D*'s sd by less than STOP_GAIN, each with
    the FLOPs still to train on it."""
    from upscale.control import suggest as module

    settings = Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)
    services = open_services(settings, auth=False)
    sid = fill(services, status="running")
    members = [seg for seg, _ in services.store.members(sid)]
    scratch = [seg for seg in members if seg.config["kind"].startswith("scratch") and
               seg.config["model"]["d_model"] == 32]
    last = max((seg for seg in scratch if seg.kind == "scratch_trunk"), key=lambda seg: seg.config["end_tokens"])
    left = [last, *(seg for seg in scratch if seg.parents == [last.key])]
    assert [seg.observation["D"] for seg in left[1:]] == [max(GRID["tokens"]["scratch"])]
    with services.store.transaction() as s:
        s.execute(update(SegmentRecord).where(SegmentRecord.key.in_([m.key for m in left])).values(status="pending"))
        s.query(ObservationRecord).filter(ObservationRecord.segment_key.in_([m.key for m in left])).delete()
    run_analysis(services, [sid], bootstrap=0, owner="alice", trigger="request")
    problem = module._Problem(services, sid, None)
    unfinished = problem.unfinished()
    assert set(unfinished) == {left[0].trunk}  # the MoE trunks are done; dense trunks are never advised
    segs, flops = unfinished[left[0].trunk]
    assert [s.id for s in segs] == [left[1].key] and flops == pytest.approx(sum(s.flops for s in left))
    for gain, listed in ((0.0, False), (1.0, True)):
        monkeypatch.setattr(module, "STOP_GAIN", gain)
        advice = problem.stop_advice()
        assert bool(advice) is listed
    assert advice[0].trunk == left[0].trunk and advice[0].remaining_flops == pytest.approx(flops)
    unseen = advice[0].sd_shrink
    assert 0.0 < unseen < 1.0  # the largest size's from-scratch decays do inform D* at that size

    # the trunk's curve predicted that decay closely: observing it now buys less than it did unseen
    record = problem.record
    o = left[1].observation
    row = {"kind": "scratch", "N": o["N1"], "D": o["D"], "N1": o["N1"], "loss": 3.0, "trunk": left[0].trunk,
           "source": "predicted", "sd_pred": 0.001}
    with services.store.transaction() as s:
        s.execute(update(AnalysisRecord).where(AnalysisRecord.id == record.id).values(
            record={**record.record, "curves": {"rows": {"scratch": [row]}}}))
    told = module._Problem(services, sid, None)
    assert len(told.criterion.current["moe"]) == len(problem.criterion.current["moe"]) + 1
    assert told.stop_advice()[0].sd_shrink < unseen / 2


def test_applying_a_suggestion_counts_against_the_in_flight_quota(analysed) -> None:
    settings, sid = analysed
    cli = open_services(settings, auth=False)  # the in-process CLI: no quota
    submit(cli, parse_spec({**GRID, "name": "waiting", "train": {**GRID["train"], "seed": 2}}), "alice", new=True)
    # the first action alone: an extension no earlier test applied (applying one that exists returns it, no quota)
    first = suggest(cli, sid, SuggestRequest(budget_flops=1e15), "alice").actions[0].marginal_flops
    with serve(settings.model_copy(update={"max_sweeps_in_flight": 1}), scheduler=False) as live, live.client() as c:
        before = len(c.get("/sweeps").json())
        r = c.post(f"/sweeps/{sid}/suggest", json={"budget_flops": first, "apply": True})
        assert r.status_code == 429 and "UPSCALE_MAX_SWEEPS_IN_FLIGHT=1" in r.json()["detail"], r.text
        assert len(c.get("/sweeps").json()) == before


def test_an_expansion_study_gets_its_own_suggestion(tmp_path, mlflow_uri) -> None:
    """`study` narrows D*_expand: the criterion is the study's own analysis, and an action counts only the 8x2 MoE's
    from-scratch decays and the study's expanded ones; an unknown study is a 422 at `study`."""
    from upscale.control import suggest as module

    grid = {**GRID, "name": "suggest-expand", "expansion": {"parents": [{"n_expert": 4, "topk": 2}], "factors": [2]}}
    services = open_services(Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri), auth=False)
    sid = fill(services, grid=grid)
    record = run_analysis(services, [sid], bootstrap=10, owner="alice", trigger="request")
    (study,) = record.record["expansions"]
    label = study["label"]
    assert label == "expand 4x2 -> 8x2 uniform" and study["analysis"] is not None, study.get("missing")
    ranked = suggest(services, sid, SuggestRequest(budget_flops=1e15, study=label), "alice")
    assert ranked.group == label and ranked.actions and ranked.delta_interval[0] < ranked.dstar
    problem = module._Problem(services, sid, None, label)
    counted = [s.observation for c in module.candidates(problem.spec)
               for s in plan(parse_spec(merge(problem.spec_data, c.additions))).observations() if problem.informs(s)]
    assert counted and {(o.kind, o.n_expert) for o in counted} <= {("scratch", 8), ("expanded", 8)}
    upcycling = module._Problem(services, sid, None)
    assert not any(upcycling.informs(s) and s.observation.kind == "scratch" and s.observation.n_expert == 8
                   for s in upcycling.planned.observations())  # the 8x2 rival is no arm of the dense->4x2 D*
    with pytest.raises(SuggestError, match="has no expansion study 'expand 4x2 -> 16x2 uniform'") as e:
        suggest(services, sid, SuggestRequest(budget_flops=1e15, study="expand 4x2 -> 16x2 uniform"), "alice")
    assert e.value.field == "study"
