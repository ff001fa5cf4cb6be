"""A segment on two processes: Ray Train starts the group, DeepSpeed trains a 4x2 MoE expert parallel (ep_size 2,
all-to-all over gloo) on half the batch per rank, and the result matches the single-process run.

Stated tolerance: the starting validation loss agrees to 1e-6 (each rank's experts are exactly its slice of the
single-process init); after 24 steps the validation loss agrees to 2e-3 relative (float summation order, and
DeepSpeed's load-balancing loss computed per rank over half the tokens: measured 1.5e-4). The checkpoint a
two-process run leaves is a full single-process model, and a decay branch from it on two processes matches the
single-process branch from the single-process trunk to the same tolerance; a single-process resume from its
sharded optimiser state is refused with what to do.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
import yaml

from tests.orchestrator.conftest import TINY_SPEC
from upscale.orchestrator.task import run_segment_task, train_segment
from upscale.sweeps.segments import DataSpec, ModelSpec, OptimSpec, ScheduleSpec, SegmentRuntime, SegmentSpec
from upscale.sweeps.spec import SpecError, parse_spec
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig
from upscale.workers.parallel import ep_size_for, expert_slice
from upscale.workers.segment import NaNLossError, run_segment
from upscale.workers.weights import load_model

TPS = 256  # batch 8 x context 32
MOE = ModelSpec(n_layer=2, d_model=32, n_head=2, vocab_size=256, context=32, n_expert=4, topk=2)
COMMON = {"model": MOE, "data": DataSpec(eval_tokens=2048), "optim": OptimSpec(lr=3e-3, batch_size=8),
          "schedule": ScheduleSpec(warmup_tokens=4 * TPS)}
TRUNK = SegmentSpec(kind="scratch_trunk", end_tokens=24 * TPS, save_at_tokens=(16 * TPS, 24 * TPS), **COMMON)
DECAY = SegmentSpec(kind="scratch_decay", start_tokens=16 * TPS, end_tokens=24 * TPS, decay_start_tokens=16 * TPS,
                    parent_ids=(TRUNK.id,), **COMMON)
REL_TOL = 2e-3


def runtime(home: Path, name: str, workers: int, **kw) -> SegmentRuntime:
    return SegmentRuntime(checkpoint_dir=str(home / name), data_cache_dir=str(home / "cache"), workers=workers,
                          num_threads=1, log_every_steps=4, **kw)


def on_ray(spec: SegmentSpec, rt: SegmentRuntime) -> dict:
    import ray

    return ray.get(run_segment_task.options(num_cpus=0).remote(train_segment, spec, rt, spec.id))


@pytest.fixture(scope="module")
def runs(ray_session, tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("worker-group")
    one = run_segment(TRUNK, runtime(home, "trunk-1", 1, eval_every_tokens=8 * TPS)).model_dump()
    two = on_ray(TRUNK, runtime(home, "trunk-2", 2, eval_every_tokens=8 * TPS))
    branch = {TRUNK.id: two["branch_checkpoints"]["4096"]}
    decay_two = on_ray(DECAY, runtime(home, "decay-2", 2, parent_checkpoints=branch))
    decay_one = run_segment(DECAY, runtime(home, "decay-1", 1, parent_checkpoints={
        TRUNK.id: one["branch_checkpoints"][16 * TPS]})).model_dump()
    return {"home": home, "one": one, "two": two, "decay_one": decay_one, "decay_two": decay_two, "branch": branch}


@pytest.mark.slow  # the `runs` fixture trains four segments, two on Ray Train: ~90 s
def test_two_workers_match_one(runs: dict) -> None:
    one, two = runs["one"], runs["two"]
    assert two["metrics"]["val_loss_start"] == pytest.approx(one["metrics"]["val_loss_start"], abs=1e-6)
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=REL_TOL)
    assert two["val_loss"] < two["metrics"]["val_loss_start"] - 1.0  # it trained
    assert two["tokens"] == one["tokens"] == 24 * TPS
    assert runs["decay_two"]["val_loss"] == pytest.approx(runs["decay_one"]["val_loss"], rel=REL_TOL)
    # rank 0's result carries the curve every rank measured (the validation sums are reduced over ranks)
    assert [t for t, _ in two["curve"]] == [t for t, _ in one["curve"]] == [0, 8 * TPS, 16 * TPS, 24 * TPS]
    assert [v for _, v in two["curve"]] == pytest.approx([v for _, v in one["curve"]], rel=REL_TOL)


@pytest.mark.slow  # the `runs` fixture trains four segments, two on Ray Train: ~90 s
def test_two_worker_checkpoint_is_the_full_model(runs: dict) -> None:
    path = Path(runs["two"]["checkpoint"])
    cfg, weights = load_model(path / "model")  # shape-checked against the single-process 4-expert model
    assert cfg.ep_size == 1 and cfg.n_expert == 4
    _, reference = load_model(Path(runs["one"]["checkpoint"]) / "model")
    gap = max(float((weights[k] - reference[k]).abs().max()) for k in reference)
    assert 0 < gap < 0.05  # the same model up to the small float differences of two processes
    meta = json.loads((path / "meta.json").read_text())
    assert meta["ep_size"] == 2 and meta["segment_id"] == TRUNK.id
    result = json.loads((runs["home"] / "trunk-2" / "result.json").read_text())
    assert result["segment_id"] == TRUNK.id  # rank 0 left the attempt's result, as a single process does


@pytest.mark.slow  # the `runs` fixture trains four segments, two on Ray Train: ~90 s
def test_single_process_resume_from_sharded_optimiser_is_refused(runs: dict) -> None:
    with pytest.raises(WorkerError, match=r"ep_size=2.*same resources\.workers"):
        run_segment(DECAY, runtime(runs["home"], "decay-refused", 1, parent_checkpoints=runs["branch"]))


def test_expert_slice_renumbers_each_ranks_experts() -> None:
    cfg = ModelConfig(n_layer=1, d_model=8, n_head=2, vocab_size=16, context=8, n_expert=4, topk=2)
    key = "blocks.0.ffn.moe.deepspeed_moe.experts.deepspeed_experts.{}.w_up.weight"
    full = {key.format(e): torch.full((2,), float(e)) for e in range(4)} | {"tok_emb.weight": torch.zeros(1)}
    second = expert_slice(full, cfg, ep_size=2, ep_rank=1)
    assert sorted(second) == [key.format(0), key.format(1), "tok_emb.weight"]
    assert second[key.format(0)][0] == 2 and second[key.format(1)][0] == 3
    assert ep_size_for(cfg, 2) == 2 and ep_size_for(cfg, 3) == 1 and ep_size_for(cfg, 8) == 4


def test_worker_errors_keep_their_type_across_processes() -> None:
    err = pickle.loads(pickle.dumps(NaNLossError(3, 768, "loss is nan", None)))
    assert isinstance(err, NaNLossError) and err.step == 3 and "lower optim.lr" in str(err)


def test_a_segment_without_its_process_group_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkerError, match="process group"):  # none, or the test process's own one-process group
        run_segment(TRUNK, runtime(tmp_path, "alone", 2))


def test_batch_must_split_over_workers() -> None:
    data = yaml.safe_load(TINY_SPEC) | {"resources": {"cpus": 1, "workers": 3}}
    with pytest.raises(SpecError, match=r"batch_size=4 does not split evenly over resources\.workers=3"):
        parse_spec(data)


@pytest.mark.slow
def test_a_sweep_with_two_workers_per_segment_trains_through_ray_train(ray_session, settings) -> None:
    """The micro sweep (one segment of each kind) with resources.workers=2: every training segment runs as a Ray
    Train group of two (~35 s each on 2 cores: slow), the upcycle alone; observations come out as usual."""
    from tests.deploy.conftest import MICRO_SPEC
    from upscale.orchestrator.scheduler import Scheduler
    from upscale.orchestrator.service import Orchestrator
    from upscale.sweeps.loader import load_spec

    spec = load_spec(MICRO_SPEC.replace("resources: {cpus: 1}", "resources: {cpus: 1, workers: 2}"))
    orch = Orchestrator.open(settings)
    out = orch.run(spec, Scheduler(orch.store, orch.settings, poll_s=0.1))
    assert out.status == "done" and len(out.trained) == 7
    obs = orch.store.observations(out.sweep_id)
    assert sorted(o.kind for o in obs) == ["dense", "scratch", "upcycled"]
    assert all(2.0 < o.loss < 6.0 for o in obs)
    moe_trunk = next(s for s, _ in orch.store.members(out.sweep_id) if s.kind == "moe_trunk")
    meta = json.loads((Path(moe_trunk.result["checkpoint"]) / "meta.json").read_text())
    assert meta["ep_size"] == 2  # trained expert parallel over the two workers
