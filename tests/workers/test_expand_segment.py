"""An expand segment: a 2x1 MoE's final weights grown to 4 experts and saved as the checkpoint its MoE trunk trains
from. Quick: from an initialised parent (every replica a copy of its expert; utility expansion reads calibration
windows; a dense parent is refused). Slow: a parent trained from scratch (trunk + decay) and the expanded trunk,
which starts at the parent's validation loss (uniform copies at top-1 keep the parent's function)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from upscale.sweeps.segments import (
    DataSpec,
    ExpandSpec,
    ModelSpec,
    OptimSpec,
    ScheduleSpec,
    SegmentRuntime,
    SegmentSpec,
)
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, build_model
from upscale.workers.segment import run_segment
from upscale.workers.weights import load_model, save_model

TPS = 256  # tokens per step: batch 8 x context 32
DENSE = ModelSpec(n_layer=2, d_model=32, n_head=2, vocab_size=256, context=32)
PARENT = DENSE.model_copy(update={"n_expert": 2, "topk": 1})
GROWN = DENSE.model_copy(update={"n_expert": 4, "topk": 1})
DATA = DataSpec(eval_tokens=1024)
TRAIN = {"data": DATA, "optim": OptimSpec(lr=3e-3, batch_size=8), "schedule": ScheduleSpec(warmup_tokens=TPS)}


def rt(home: Path, name: str, **kw) -> SegmentRuntime:
    return SegmentRuntime(checkpoint_dir=str(home / name), data_cache_dir=str(home / "cache"), **kw)


def expand_seg(strategy: str = "uniform") -> SegmentSpec:
    return SegmentSpec(kind="expand", model=GROWN, data=DATA, parent_ids=("parent",),
                       expand=ExpandSpec(factor=2, strategy=strategy))


def initialised(home: Path, spec: ModelSpec) -> str:
    """A checkpoint folder holding an initialised model, as a parent's."""
    cfg = ModelConfig.from_spec(spec)
    save_model(home / "model", cfg, build_model(cfg, 0).state_dict())
    return str(home)


def test_expanded_checkpoint_has_m_times_e_experts(tmp_path: Path) -> None:
    parent = initialised(tmp_path / "parent", PARENT)
    res = run_segment(expand_seg(), rt(tmp_path, "grow", parent_checkpoints={"parent": parent}))
    assert res.kind == "expand" and res.val_loss is None and res.tokens == 0
    cfg, sd = load_model(Path(res.checkpoint) / "model")
    _, before = load_model(Path(parent) / "model")
    assert (cfg.n_expert, cfg.topk) == (4, 1)
    experts = sorted(k for k in sd if ".deepspeed_experts.3." in k)
    assert experts and all(torch.equal(sd[k], before[k.replace(".3.", ".1.")]) for k in experts)  # uniform: 0 0 1 1


def test_utility_expansion_reads_calibration_windows(tmp_path: Path) -> None:
    parent = initialised(tmp_path / "parent", PARENT)
    res = run_segment(expand_seg("utility"), rt(tmp_path, "grow", parent_checkpoints={"parent": parent}))
    assert load_model(Path(res.checkpoint) / "model")[0].n_expert == 4


def test_a_dense_parent_is_refused(tmp_path: Path) -> None:
    parent = initialised(tmp_path / "parent", DENSE)
    with pytest.raises(WorkerError, match="is not an MoE checkpoint"):
        run_segment(expand_seg(), rt(tmp_path, "grow", parent_checkpoints={"parent": parent}))


@pytest.mark.slow
def test_the_expanded_trunk_starts_at_its_trained_parents_loss(tmp_path: Path) -> None:
    trunk = SegmentSpec(kind="scratch_trunk", model=PARENT, end_tokens=3 * TPS, **TRAIN)
    tr = run_segment(trunk, rt(tmp_path, "trunk"))
    decay = SegmentSpec(kind="scratch_decay", model=PARENT, start_tokens=3 * TPS, end_tokens=4 * TPS,
                        decay_start_tokens=3 * TPS, parent_ids=(trunk.id,), **TRAIN)
    dr = run_segment(decay, rt(tmp_path, "decay", parent_checkpoints={trunk.id: tr.checkpoint}))
    grow = expand_seg().model_copy(update={"parent_ids": (decay.id,)})
    gr = run_segment(grow, rt(tmp_path, "grow", parent_checkpoints={decay.id: dr.checkpoint}))
    moe = SegmentSpec(kind="moe_trunk", model=GROWN, end_tokens=TPS, parent_ids=(grow.id,), **TRAIN)
    res = run_segment(moe, rt(tmp_path, "moe", parent_checkpoints={grow.id: gr.checkpoint}))
    # the replicas tie and a top-1 weight is 1: the expanded model computes its parent's function
    assert res.metrics["val_loss_start"] == pytest.approx(dr.val_loss, abs=1e-5)
