"""Analyses in MLflow (control/analysis_run.py): a sweep's run shows the newest analysis of that sweep, whatever
else analyses it, and every analysis keeps its own files.

Strategy: a real SQLite store and a real MLflow SQLite store, no mocks. Two sweeps filled the way the scheduler
fills them (tests/api/test_analysis.py's `fill`: Table 2's laws at the planned coordinates), each with its parent
run as the scheduler makes it. Sweep A is analysed by the loop; then another owner's refit schedule analyses A+B,
an ad-hoc request analyses A+B, a refit analyses A alone, a request analyses A with other parameters (A's newest
own analysis), and an older analysis of A finishes late. Read back through MlflowClient: A's description, pointer
and metrics follow its own newest analysis only; every analysis's files are under `analyses/<id>/` of the run it
belongs to; the shared ones have runs of their own, linked from the other sweep. The summary's spelling of open,
missing, unhealthy and extrapolated values is checked on a record with the fitting layer's newer keys.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from tests.api.test_analysis import GRID, OTHER_GRID, fill
from upscale.control import analysis_run
from upscale.control.analyses import run_analysis
from upscale.control.analysis_run import (
    ANALYSIS_COUNT,
    ANALYSIS_ID,
    HEALTH,
    LATEST,
    PROBLEMS,
    AnalysisMeta,
    curves,
    headline,
    log_analysis,
    summary_markdown,
)
from upscale.control.refits import create_schedule, run_refit
from upscale.control.schemas import RefitScheduleCreate
from upscale.control.wiring import open_services
from upscale.orchestrator.clock import as_utc
from upscale.orchestrator.tracking import NOTE, RunTree


def files(client, run_id: str, path: str) -> set[str]:
    return {f.path for f in client.list_artifacts(run_id, path)}


@pytest.mark.slow  # four analyses, each ~12 s on 2 cores (mostly their plots); the routing alone is tested below
def test_a_sweeps_run_shows_its_own_newest_analysis_and_every_analysis_keeps_its_files(settings, tmp_path) -> None:
    services = open_services(settings, auth=False)
    tree = RunTree.for_settings(settings)
    client = tree.client
    a, b = fill(services), fill(services, grid=OTHER_GRID)
    runs = {sid: tree.start_sweep(sid, grid["name"], grid) for sid, grid in ((a, GRID), (b, OTHER_GRID))}
    for sid, run_id in runs.items():  # the sweeps' parent runs, as the scheduler makes them
        services.store.set_sweep(sid, mlflow_run_id=run_id)

    first = run_analysis(services, [a], bootstrap=0, owner="alice", trigger="completed")
    shown = client.get_run(runs[a]).data.tags
    assert shown[LATEST] == first.id and first.id in shown[NOTE] and "D*" in shown[NOTE]
    assert shown[PROBLEMS] == str(len(first.record["problems"])) and shown[HEALTH] in ("ok", "unhealthy")

    schedule = create_schedule(services, RefitScheduleCreate(name="both", trigger="on_new_observations",
                                                             request={"sweep_ids": [a, b], "n1": 2e4}), "bob")
    refit = run_refit(services, schedule)
    ad_hoc = run_analysis(services, [a, b], n1s=[3e4], bootstrap=0, owner="carol", trigger="request")
    assert len({first.id, refit.analysis_id, ad_hoc.id}) == 3

    # none of them is A's own: A's run still shows its first analysis, and B's run shows no analysis at all
    tags = client.get_run(runs[a]).data.tags
    assert tags[LATEST] == first.id and tags[NOTE] == shown[NOTE]
    assert NOTE not in client.get_run(runs[b]).data.tags and LATEST not in client.get_run(runs[b]).data.tags
    assert files(client, runs[a], "analyses") == {f"analyses/{first.id}"}  # no other analysis wrote here
    assert files(client, runs[b], "analyses") == set()

    # each has a run of its own, under the first of its sweeps, with its files and its own description
    exp = [tree.experiment_id]
    for analysis_id, owner in ((refit.analysis_id, "bob"), (ad_hoc.id, "carol")):
        (own,) = client.search_runs(exp, f"tags.`{ANALYSIS_ID}` = '{analysis_id}' and tags.`upscale.role` = "
                                         f"'analysis'")
        sweeps = sorted([a, b])
        assert own.data.tags["mlflow.parentRunId"] == runs[sweeps[0]] and own.info.status == "FINISHED"
        assert analysis_id in own.data.tags[NOTE] and owner in own.data.tags[NOTE]
        folder = f"analyses/{analysis_id}"
        assert {f"{folder}/{name}" for name in ("analysis.json", "dstar.csv", "verdicts.csv", "observations.csv",
                                                "plots")} <= files(client, own.info.run_id, folder)
        links = client.search_runs(exp, f"tags.`{ANALYSIS_ID}` = '{analysis_id}' and tags.`upscale.role` = "
                                         f"'analysis-link'")
        assert [r.data.tags["mlflow.parentRunId"] for r in links] == [runs[s] for s in sweeps[1:]]
        assert all(own.info.run_id in r.data.tags[NOTE] for r in links)
        assert "analysis.E" in own.data.tags
    observed = pd.read_csv(client.download_artifacts(own.info.run_id, f"analyses/{ad_hoc.id}/observations.csv",
                                                     str(tmp_path)))
    assert len(observed) == len(services.store.observations(a)) + len(services.store.observations(b))

    # A's own newer analysis (other parameters) is shown; the first one's files stay beside it
    second = run_analysis(services, [a], n1s=[2e4], bootstrap=0, owner="alice", trigger="request")
    tags = client.get_run(runs[a]).data.tags
    assert tags[LATEST] == second.id and second.id in tags[NOTE] and first.id not in tags[NOTE]
    assert files(client, runs[a], "analyses") == {f"analyses/{first.id}", f"analyses/{second.id}"}
    for done in (first, second):
        back = client.download_artifacts(runs[a], f"analyses/{done.id}/analysis.json", str(tmp_path / done.id))
        assert json.loads(Path(back).read_text())["n1s"] == done.record["n1s"]
    assert client.get_run(runs[a]).data.tags[ANALYSIS_COUNT] == "2"

    # an older analysis of A that finishes late keeps its files but does not replace the newer one shown
    late = AnalysisMeta("late0000", [a], "request", "dave", as_utc(second.created_at) - timedelta(seconds=1))
    log_analysis(tree, [(a, runs[a])], late, first.record, pd.DataFrame({"loss": [1.0]}), None)
    tags = client.get_run(runs[a]).data.tags
    assert tags[LATEST] == second.id and "late0000" not in tags[NOTE]
    assert "analyses/late0000/analysis.json" in files(client, runs[a], "analyses/late0000")
    assert client.get_run(runs[a]).data.tags[ANALYSIS_COUNT] == "2"


def test_where_each_analysis_lands(settings, tmp_path) -> None:
    """The routing alone, on the real MLflow store, with log_analysis called as control/analyses.py calls it."""
    from datetime import UTC, datetime

    tree = RunTree.for_settings(settings)
    client, exp = tree.client, [tree.experiment_id]
    runs = {sid: tree.start_sweep(sid, sid, {"name": sid}) for sid in ("sweep-a", "sweep-b")}
    (plots := tmp_path / "plots" / "naive_4x2").mkdir(parents=True)
    (plots / "parity.png").write_bytes(b"png")
    observations = pd.DataFrame({"kind": ["dense"], "loss": [3.0]})
    t0 = datetime(2025, 1, 1, tzinfo=UTC)

    def log(analysis_id: str, sweeps: list[str], trigger: str, owner: str, minutes: int, record: dict) -> str:
        meta = AnalysisMeta(analysis_id, sweeps, trigger, owner, t0 + timedelta(minutes=minutes))
        return log_analysis(tree, [(s, runs[s]) for s in sweeps], meta, record, observations, plots.parent)

    assert log("own1", ["sweep-a"], "completed", "alice", 0, {**RECORD_NEW, "E": 1.5}) == runs["sweep-a"]
    refit = log("refit2", ["sweep-a", "sweep-b"], "refit", "bob", 1, {"E": 0.0, "upcycled": []})
    adhoc = log("adhoc3", ["sweep-a", "sweep-b"], "request", "carol", 2, {"E": 0.1})
    refit_a = log("refit4", ["sweep-a"], "refit", "bob", 3, {"E": 0.2})  # a refit of A alone is not A's own either
    assert len({refit, adhoc, refit_a, runs["sweep-a"]}) == 4
    a = client.get_run(runs["sweep-a"])
    assert a.data.tags[LATEST] == "own1" and "own1" in a.data.tags[NOTE] and "Shared E = 1.5" in a.data.tags[NOTE]
    assert a.data.tags[HEALTH] == "unhealthy" and a.data.tags[PROBLEMS] == "1" and a.data.tags["analysis.E"] == "1.5"
    assert NOTE not in client.get_run(runs["sweep-b"]).data.tags
    assert files(client, runs["sweep-a"], "analyses") == {"analyses/own1"}
    assert "analyses/own1/plots/naive_4x2" in files(client, runs["sweep-a"], "analyses/own1/plots")
    for run_id, analysis_id, parent in ((refit, "refit2", "sweep-a"), (adhoc, "adhoc3", "sweep-a"),
                                        (refit_a, "refit4", "sweep-a")):
        run = client.get_run(run_id)
        assert run.data.tags["mlflow.parentRunId"] == runs[parent] and run.data.tags[ANALYSIS_ID] == analysis_id
        assert {f"analyses/{analysis_id}/{n}" for n in ("analysis.json", "dstar.csv", "verdicts.csv", "plots")} <= \
            files(client, run_id, f"analyses/{analysis_id}")
    (link,) = client.search_runs(exp, f"tags.`{ANALYSIS_ID}` = 'refit2' and tags.`upscale.role` = 'analysis-link'")
    assert link.data.tags["mlflow.parentRunId"] == runs["sweep-b"] and refit in link.data.tags[NOTE]
    assert "bob" in link.data.tags[NOTE] and "Shared E = 0" in link.data.tags[NOTE]

    log("own5", ["sweep-a"], "request", "alice", 4, {"E": 1.7})  # A's newest: shown
    log("own0", ["sweep-a"], "request", "dave", -1, {"E": 9.9})  # older, finishing late: kept, not shown
    a = client.get_run(runs["sweep-a"])
    assert a.data.tags[LATEST] == "own5" and "Shared E = 1.7" in a.data.tags[NOTE] and a.data.tags[HEALTH] == "ok"
    assert files(client, runs["sweep-a"], "analyses") == {"analyses/own1", "analyses/own5", "analyses/own0"}
    assert a.data.tags["analysis.E"] == "1.7" and a.data.tags[ANALYSIS_COUNT] == "2"
    # D* as one curve over N1 (step = N1), never one single-point metric per N1
    assert [(m.step, m.value) for m in client.get_metric_history(runs["sweep-a"], "dstar/all")] == [(10000, 2e9)]
    back = client.download_artifacts(runs["sweep-a"], "analyses/own0/analysis.json", str(tmp_path))
    assert json.loads(Path(back).read_text())["E"] == 9.9


RESULT_NEW = {"n1": 2e4, "dstar": None, "dstar_state": "above", "ci": [None, None],
              "intervals": {"80": {"low": 3e9, "high": None, "low_open": False, "high_open": True},
                            "95": {"low": None, "high": None, "low_open": False, "high_open": True}},
              "interval_note": "the 95% interval's low end was not found", "health": "unhealthy",
              "health_problems": [{"law": "joint", "fit": "upcycled", "kind": "bound"}],
              "extrapolation": {"n1_factor": 40.0, "tokens_factor": 1.0, "flagged": True,
                                "note": "N1 is 40 times the largest trained"}}
RECORD_NEW = {
    "E": 1.8, "problems": [{"law": "joint", "fit": "upcycled", "why": "alpha1=0 at its bound", "add": "more N1",
                            "kind": "bound"}],
    "trained": {"upcycled": {"N1": [1e4, 3e4], "D1": [1024, 2048], "D2": [512, 2048]},
                "scratch": {"N": [1e4, 3e4], "D": [1024, 4096]}},
    "upcycled": [{"group": {}, "fit": {"params": {"A": 1.0}},
                  "dstar": {"results": [RESULT_NEW,
                                        {"n1": 1e4, "dstar": 2e9, "dstar_state": "crossing", "ci": [1e9, 4e9],
                                         "intervals": {"80": {"low": 1e9, "high": 4e9, "low_open": False,
                                                              "high_open": False}},
                                         "health": "ok", "health_problems": [],
                                         "extrapolation": {"n1_factor": 1.0, "tokens_factor": 1.0,
                                                           "flagged": False, "note": ""}}]},
                  "decisions": [{"n1": 2e4, "d1": 1024, "d2": 512, "verdict": "upcycle", "probability_upcycle": None,
                                 "health": "unhealthy", "health_problems": [{"fit": "upcycled", "kind": "bound"}],
                                 "extrapolation": {"n1_factor": 40.0, "flagged": True}}]}],
}


def test_the_summary_shows_health_extrapolation_and_tells_open_from_missing() -> None:
    from datetime import UTC, datetime

    meta = AnalysisMeta("abc123", ["s1"], "request", "alice", datetime(2025, 1, 2, tzinfo=UTC))
    text = summary_markdown(RECORD_NEW, meta, "Analysis 1 of this sweep")
    above, crossing = [line for line in text.splitlines() if line.startswith(("| all | 2e+04 |", "| all | 1e+04 |"))
                       and "| upcycle |" not in line]
    assert "beyond the searched range" in above and "80%: 3e+09 – unbounded" in above
    assert "95%: – – unbounded" in above  # a missing low end and an open high end, never the same word
    assert "⚠ unhealthy (bound)" in above and "⚠ extrapolated N1 ×40" in above
    assert "| 2e+09 |" in crossing and "| ok | no |" in crossing
    verdict = next(line for line in text.splitlines() if "| upcycle |" in line)
    assert "⚠ unhealthy" in verdict and "⚠ extrapolated" in verdict and "| – |" in verdict  # P(upcycle) missing
    assert "Trained on: upcycled N1 1e+04–3e+04" in text and "alpha1=0 at its bound" in text
    assert "N1 is 40 times the largest trained" in text and "Health: ⚠ unhealthy, 1 problem(s)" in text
    points = {(m.key, m.step): m.value for m in curves(RECORD_NEW)}
    assert not any(step == 20000 for _, step in points)  # beyond the range: no D* number, P(upcycle) missing
    assert points[("dstar/all", 10000)] == 2e9 and points[("dstar/all/high_80", 10000)] == 4e9
    assert ("dstar/all/low_95", 10000) not in points
    assert headline(RECORD_NEW) == {"analysis.E": "1.8", "analysis.fit.all.A": "1"}
    assert analysis_run.health_tags(RECORD_NEW) == {HEALTH: "unhealthy", PROBLEMS: "1",
                                                    analysis_run.EXTRAPOLATED: "2"}


STUDY = "expand 4x1 -> 8x1 uniform"
RECORD_EXPANSION = {**RECORD_NEW, "expansions": [
    {"label": STUDY, "group": {"parent_experts": 4, "n_expert": 8, "topk": 1, "method": "expand-uniform", "r": None},
     "points": {"parent": 8, "from scratch": 8, "expanded": 12}, "missing": [],
     "analysis": {**RECORD_NEW, "upcycled": [{**RECORD_NEW["upcycled"][0], "group": {"method": STUDY}}]}},
    {"label": "expand 8x1 -> 16x1 utility", "points": {"parent": 8, "from scratch": 0, "expanded": 12},
     "group": {"parent_experts": 8, "n_expert": 16, "topk": 1, "method": "expand-utility", "r": None},
     "missing": [{"arm": "from scratch", "why": "no from-scratch runs of the 16x1 MoE",
                  "add": "from-scratch 16x1 runs at the same sizes over several budgets D"}], "analysis": None}]}


def test_an_expansion_study_is_one_more_group_and_a_missing_arm_a_problem() -> None:
    """D*_expand is tabled, charted and tagged under its study's name; a study lacking an arm says so in the
    summary and counts as a problem, as do its fits' own."""
    from datetime import UTC, datetime

    from upscale.control.analysis_run import dstar_rows, verdict_rows

    assert {r["group"] for r in dstar_rows(RECORD_EXPANSION)} == {"all", STUDY}
    assert {r["group"] for r in verdict_rows(RECORD_EXPANSION)} == {"all", STUDY}
    meta = AnalysisMeta("abc123", ["s1"], "request", "alice", datetime(2025, 1, 2, tzinfo=UTC))
    text = summary_markdown(RECORD_EXPANSION, meta, "Analysis 1 of this sweep")
    assert f"| {STUDY} | 1e+04 | 2e+09 |" in text and "Expansion 4x1 -> 8x1 uniform:" in text
    assert "Expansion 8x1 -> 16x1 utility: not analysed: no from-scratch runs of the 16x1 MoE" in text
    assert f"{STUDY}: upcycled [bound]: alpha1=0 at its bound" in text
    assert ("dstar/expand_4x1_8x1_uniform", 10000) in {(m.key, m.step) for m in curves(RECORD_EXPANSION)}
    assert headline(RECORD_EXPANSION)["analysis.fit.expand_4x1_8x1_uniform.A"] == "1"
    assert analysis_run.health_tags(RECORD_EXPANSION)[PROBLEMS] == "3"


def test_a_long_summary_is_cut_to_what_mlflow_keeps_and_says_where_the_rest_is() -> None:
    """MLflow keeps a tag's first 8000 characters: the demo's 17 problems ran past them, mid-word. The description is
    cut at a line, with the legend kept, and says how much is left out and where the whole record is."""
    from datetime import UTC, datetime

    many = {**RECORD_NEW, "problems": [{"law": "joint", "fit": f"upcycled g{i}", "kind": "interval",
                                        "why": "the 95% interval is very wide " * 8, "add": "more trunks " * 6}
                                       for i in range(40)]}
    meta = AnalysisMeta("abc123", ["s1"], "request", "alice", datetime(2025, 1, 2, tzinfo=UTC))
    text = summary_markdown(many, meta, "Analysis 1 of this sweep")
    assert len(text) <= analysis_run.MAX_NOTE and "Intervals: an open end is" in text
    assert text.splitlines()[-1].startswith("… ") and "`analyses/abc123/analysis.json`" in text.splitlines()[-1]
    assert "more line(s)" not in summary_markdown(RECORD_NEW, meta, "Analysis 1 of this sweep")  # a short one whole


@pytest.mark.parametrize("record", [{"E": None, "upcycled": [{"dstar": {"results": [{"n1": 1e4, "dstar": 3e9,
                                                                                       "ci": [1e9, None]}]},
                                                              "decisions": [{"verdict": "scratch"}]}]}])
def test_an_old_record_without_the_new_keys_reads_as_missing(record) -> None:
    from datetime import UTC, datetime

    text = summary_markdown(record, AnalysisMeta("old", ["s"], "completed", "a", datetime.now(UTC)), "Old")
    row = next(line for line in text.splitlines() if line.startswith("| all | 1e+04"))
    assert row == "| all | 1e+04 | 3e+09 | 1e+09 – – | – | – |"
    assert analysis_run.health_tags(record) == {HEALTH: "ok", PROBLEMS: "0"}  # no extrapolation count it cannot know


def test_curves_put_each_dstars_predicted_share_in_mlflow_in_batches_it_accepts(mlflow_uri) -> None:
    """With predicted decays each D* carries its evidence: the share becomes a curve over N1 beside the observed-only
    D*, each group's largest share and its decay counts become tags; more tags than one log_batch takes are split."""
    results = [{**r, "evidence": {"observed": {"scratch": 20, "upcycled": 30}, "predicted": {"scratch": 4,
                                                                                          "upcycled": 8},
                                  "predicted_share": share, "observed_dstar": 2.5e9}}
               for r, share in zip(RECORD_NEW["upcycled"][0]["dstar"]["results"], (0.38, 0.6), strict=False)]
    up = {**RECORD_NEW["upcycled"][0], "dstar": {**RECORD_NEW["upcycled"][0]["dstar"], "results": results}}
    families = {"upcycled naive 8x2": {"sd": 0.01523, "pooling": "pooled", "n_predicted": 8},
                "scratch": {"sd": 0.0199, "pooling": "own", "n_predicted": 0, "why": "no decay to predict"}}
    record = {**RECORD_NEW, "upcycled": [up], "curves": {"families": families}}
    tags = headline(record)
    assert tags["analysis.evidence.all.predicted"] == "12" and tags["analysis.evidence.all.observed"] == "50"
    # each family that predicted: its held-out error and whose decay parameters (none for one that predicted none)
    assert {k: v for k, v in tags.items() if k.startswith("analysis.curves.")} == {
        "analysis.curves.upcycled_naive_8x2.held_out_sd": "0.01523",
        "analysis.curves.upcycled_naive_8x2.decay_parameters": "pooled"}
    assert tags["analysis.evidence.all.predicted_share"] == "0.6"  # the largest of its D*s
    points = {(m.key, m.step): m.value for m in curves(record)}
    assert points[("dstar/all/predicted_share", 10000)] == 0.6 and points[("dstar/all/observed_only", 10000)] == 2.5e9
    assert "analysis.evidence.all.predicted" not in headline(RECORD_NEW)  # no curves, no evidence tags

    tree = RunTree(mlflow_uri)
    run_id = tree.client.create_run(tree.experiment_id).info.run_id
    many = {f"analysis.fit.g{i}.A": str(i) for i in range(analysis_run.MAX_TAGS_PER_BATCH + 5)}
    analysis_run.log_in_batches(tree, run_id, curves(record), many)
    logged = tree.client.get_run(run_id).data
    assert all(logged.tags.get(k) == v for k, v in many.items()) and "dstar/all/predicted_share" in logged.metrics
