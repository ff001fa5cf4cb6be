"""Code-aware identity: a bump of the training-semantics version changes every planned key; the store's segments of
the same jobs under the older version are reported stale and retrained, or, asked (`reuse_stale`), taken over with
their results and checkpoints (children train from those), and the sweep and its MLflow run say so. Real Ray, SQLite
and MLflow; the counting segment function (tests/orchestrator/segment_fns.py) stands in for training."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from tests.orchestrator.conftest import TINY_NAIVE_SPEC, TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment, loss_of
from upscale.api.cli.run_commands import trained_report
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.sweeps import run_tags, segments
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan
from upscale.sweeps.reuse import unversioned_ids

pytestmark = pytest.mark.usefixtures("ray_session")

def _run(orch: Orchestrator, spec, reuse_stale: bool = False):
    return orch.run(spec, Scheduler(orch.store, orch.settings, segment_fn=counting_segment, poll_s=0.05),
                    reuse_stale=reuse_stale)


def test_a_version_bump_makes_segments_stale_and_retrains_them(settings, monkeypatch) -> None:
    orch = Orchestrator.open(settings)
    micro = load_spec(TINY_NAIVE_SPEC)
    v1 = plan(micro)
    assert len(_run(orch, micro).trained) == len(v1.segments)
    assert orch.compare(v1).stale == {} and orch.compare(v1).figures()["new_segments"] == 0

    monkeypatch.setattr(segments, "TRAINING_SEMANTICS", 2)
    v2 = plan(micro)
    assert not {s.id for s in v2.segments} & {s.id for s in v1.segments}  # every key changed
    expected = {new.id: old.id for new, old in zip(v2.segments, v1.segments, strict=True)}
    assert unversioned_ids(v2.segments) == expected  # the same jobs: their version-1 keys
    check = orch.compare(v2)
    assert check.stale == expected and check.figures()["new_segments"] == len(v2.segments)

    again = _run(orch, micro)  # an identical spec under a new version: a new sweep, retrained
    assert sorted(again.trained) == sorted(expected)
    sweep = orch.store.sweep(again.sweep_id)
    assert sweep.stale_segments == expected and not sweep.reuse_stale
    rows = orch.store.segments(list(expected))
    assert all(r.semantics == 2 and r.reused_from is None and r.unversioned_key == expected[r.key]
               for r in rows.values())
    assert orch.compare(v2).stale == {}  # done under the current version: nothing stale any more


def test_reuse_stale_takes_results_over_and_children_train_from_them(settings, monkeypatch) -> None:
    orch = Orchestrator.open(settings)
    micro, tiny = load_spec(TINY_NAIVE_SPEC), load_spec(TINY_SPEC)
    _run(orch, micro)
    old = {s.id: s for s in plan(micro).segments}

    monkeypatch.setattr(segments, "TRAINING_SEMANTICS", 2)
    p = plan(tiny)  # the micro grid grown by a method and scratch runs, under a new version
    check = orch.compare(p, reuse_stale=True)
    assert set(check.stale.values()) == set(old) and len(check.stale) == len(old)
    figures = check.figures()
    out = _run(orch, tiny, reuse_stale=True)
    trained = {s.id for s in check.to_train()}
    assert set(out.trained) == trained and not trained & set(check.stale)
    report = trained_report(orch, out)
    assert report["trained"] == {"segments": figures["new_segments"], "tokens": figures["new_tokens"],
                                 "flops": pytest.approx(figures["new_flops"])}
    assert report["reused"] == {"segments": len(old)} and report["stale"] == {"segments": sorted(check.stale),
                                                                                "reused": True}

    sweep = orch.store.sweep(out.sweep_id)
    assert sweep.reuse_stale and sweep.stale_segments == check.stale
    rows = orch.store.segments(list(check.stale))
    assert all(rows[k].status == "done" and rows[k].reused_from == check.stale[k] for k in check.stale)
    observed = {o.segment_key: o for o in orch.store.observations(out.sweep_id)}
    for new_key, old_key in check.stale.items():  # the old loss, observed at the new key on the new trunk
        if old[old_key].observation is not None:
            assert observed[new_key].loss == pytest.approx(loss_of(old[old_key].spec))
            assert observed[new_key].trunk == next(s.trunk for s in p.segments if s.id == new_key)
    tags = MlflowClient(settings.mlflow_tracking_uri).get_run(sweep.mlflow_run_id).data.tags
    assert tags[run_tags.REUSE_STALE] == str(len(check.stale))
