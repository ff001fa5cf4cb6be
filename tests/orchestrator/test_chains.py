"""Chained trunks: a grid grown in steps trains exactly the tokens of the whole grid trained once (new pieces and
branches only); an inserted interior budget retrains only the span from the branch point before it, the rest found
under the keys of the coarser cut and taken over. Real Ray, SQLite and MLflow; the counting segment function
(tests/orchestrator/segment_fns.py) stands in for training, except in the last test, which trains for real."""

from __future__ import annotations

import pytest

from tests.orchestrator.segment_fns import counting_segment
from upscale.api.cli.run_commands import trained_report
from upscale.control.plans import plan_summary
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import Settings
from upscale.sweeps.planner import plan
from upscale.sweeps.spec import parse_spec

pytestmark = pytest.mark.usefixtures("ray_session")


def _spec(d1: list[int], d2: list[int], scratch: list[int] | None = None, name: str = "grow"):
    tokens = {"d1": d1, "d2": d2} | ({"scratch": scratch} if scratch else {})
    return parse_spec({"name": name, "model": {"sizes": ["nano"]}, "moe": {"experts": [4], "topk": [1]},
                       "upcycling": {"methods": ["naive"]}, "tokens": tokens, "data": {"eval_tokens": 256},
                       "train": {"context": 16, "batch_size": 4, "lr": {"dense": 3.0e-3, "moe": 2.0e-3},
                                 "warmup_tokens": 64},
                       "resources": {"cpus": 1}})


def _scheduler(orch: Orchestrator, **kw) -> Scheduler:
    return Scheduler(orch.store, orch.settings, poll_s=0.05, **kw)


def _tokens_trained(orch: Orchestrator, out) -> int:
    return trained_report(orch, out)["trained"]["tokens"]


@pytest.mark.slow  # ~9 s on 2 busy cores (make test stays under 10 minutes)
def test_a_grid_grown_in_two_steps_trains_the_whole_grids_tokens(settings, tmp_path) -> None:
    small, grown = _spec([512, 1024], [256], [512]), _spec([512, 1024, 1536], [256, 512], [512, 1024])
    two = Orchestrator.open(settings)
    first = two.run(small, _scheduler(two, segment_fn=counting_segment))
    check = two.compare(plan(grown))
    figures = check.figures()
    second = two.run(grown, _scheduler(two, segment_fn=counting_segment))
    # What the plan said the growth trains is what it trained: the new pieces and branches only.
    assert sorted(second.trained) == sorted(s.id for s in check.to_train())
    assert _tokens_trained(two, second) == figures["new_tokens"] < figures["tokens"]
    dense = [s for s in check.to_train() if s.spec.kind == "dense_trunk"]
    assert [(d.spec.start_tokens, d.spec.end_tokens) for d in dense] == [(896, 1408)]  # one piece appended

    once = Orchestrator.open(Settings(home=tmp_path / "once", mlflow_tracking_uri=settings.mlflow_tracking_uri))
    whole = once.run(grown, _scheduler(once, segment_fn=counting_segment))
    assert _tokens_trained(two, first) + _tokens_trained(two, second) == _tokens_trained(once, whole)
    assert _tokens_trained(once, whole) == sum(s.tokens for s in plan(grown).segments)
    assert {o.segment_key: o.loss for o in two.store.observations(second.sweep_id)} == {
        o.segment_key: o.loss for o in once.store.observations(whole.sweep_id)}


def test_an_interior_budget_retrains_only_the_span_up_to_its_branch_point(settings) -> None:
    orch = Orchestrator.open(settings)
    outer, inner = _spec([512, 1536], [256]), _spec([512, 1024, 1536], [256])
    orch.run(outer, _scheduler(orch, segment_fn=counting_segment))
    before = {s.id for s in plan(outer).segments}
    dense = [s for s in plan(inner).segments if s.spec.kind == "dense_trunk"]
    assert [(d.spec.start_tokens, d.spec.end_tokens) for d in dense] == [(0, 448), (448, 896), (896, 1408)]
    check = orch.compare(plan(inner))
    new = {s.id: s for s in check.to_train()}
    # Kept: the piece [0, 448) and its branches. The piece [896, 1408) has a new key (its parent is the new piece
    # [448, 896)) but the store holds its state: the old piece [448, 1408) ends there. So it, the D1=1536 decay and
    # that decay's MoE chain are taken over; only [448, 896) and the new D1=1024 branch train.
    assert dense[0].id in before and set(new) & {d.id for d in dense} == {dense[1].id}
    assert check.other_cuts[dense[2].id] in before
    # the plan summary counts them as taken over, not as new
    summary = plan_summary(check, inner)
    assert summary.other_cut_segments == len(check.other_cuts) > 0 and summary.new_segments == len(new)
    assert {s.axes["D1"] for s in new.values() if s.spec.kind != "dense_trunk"} == {1024}
    out = orch.run(inner, _scheduler(orch, segment_fn=counting_segment))
    assert sorted(out.trained) == sorted(new)
    assert _tokens_trained(orch, out) == check.figures()["new_tokens"]
    assert {o.segment_key for o in orch.store.observations(out.sweep_id)} == {
        s.id for s in plan(inner).observations()}  # every observation of the grown grid, old ones under new keys


@pytest.mark.slow  # three sweeps of real training: ~150 s on 2 cores
def test_real_training_grown_by_an_interior_budget_gives_the_whole_grids_losses(settings, tmp_path) -> None:
    """The real worker (torch, DeepSpeed-MoE): a grid grown by an interior D1 trains only the new dense piece, its
    decay and that decay's MoE chain, and takes the rest over from the coarser cut; its losses are those of the grown
    grid trained once."""
    small, grown = _spec([512, 1536], [256]), _spec([512, 1024, 1536], [256])
    two = Orchestrator.open(settings)
    first = two.run(small, _scheduler(two))
    assert first.status == "done"
    check = two.compare(plan(grown))
    second = two.run(grown, _scheduler(two))
    assert second.status == "done"
    assert _tokens_trained(two, second) == check.figures()["new_tokens"]
    once = Orchestrator.open(Settings(home=tmp_path / "once", mlflow_tracking_uri=settings.mlflow_tracking_uri))
    whole = once.run(grown, _scheduler(once))
    grown_losses = {o.segment_key: o.loss for o in two.store.observations(second.sweep_id)}
    once_losses = {o.segment_key: o.loss for o in once.store.observations(whole.sweep_id)}
    assert grown_losses.keys() == once_losses.keys() and len(once_losses) == 6
    # One schedule cut in different places computes the same thing (fp32 on CPU, checkpoints keep optimiser state).
    assert grown_losses == pytest.approx(once_losses, rel=1e-5)
