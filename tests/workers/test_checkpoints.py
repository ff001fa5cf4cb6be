"""An MoE checkpoint (experts in DeepSpeed's per-expert files, optimiser state, sidecar) round-trips exactly: a fresh
engine of another seed that loads it holds the same tensors and takes the same next step; a checkpoint of another
shape is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from upscale.sweeps.segments import OptimSpec
from upscale.workers import checkpoints
from upscale.workers.engine import build_engine, train_step
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, build_model

CFG = ModelConfig(n_layer=2, d_model=32, n_head=2, vocab_size=64, context=16, n_expert=4, topk=2)
OPTIM = OptimSpec(lr=1e-3, batch_size=4)


def batch(i: int) -> torch.Tensor:
    return torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(i))


def test_moe_checkpoint_round_trips(tmp_path: Path, dist_group: None) -> None:
    a = build_engine(build_model(CFG, seed=0), OPTIM)
    for i in range(2):
        train_step(a, batch(i), 1e-3, CFG.aux_loss_coef, "cpu")
    path = checkpoints.save(a, tmp_path, 8, CFG, {"segment_id": "s1"})
    assert len(list(path.glob("layer_*_expert_*_model_states.pt"))) == CFG.n_layer * CFG.n_expert
    assert checkpoints.complete(tmp_path, "s1") == {8: path} and checkpoints.complete(tmp_path, "other") == {}

    b = build_engine(build_model(CFG, seed=1), OPTIM)
    assert checkpoints.load(b, path, CFG)["tokens"] == 8
    sa, sb = a.module.state_dict(), b.module.state_dict()
    assert any(".deepspeed_experts.3.w_down" in k for k in sa)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a.optimizer.state_dict()["state"].keys() == b.optimizer.state_dict()["state"].keys()
    # the optimiser moments came back too: the next step is identical
    la = train_step(a, batch(9), 1e-3, CFG.aux_loss_coef, "cpu")
    lb = train_step(b, batch(9), 1e-3, CFG.aux_loss_coef, "cpu")
    assert la == lb
    assert all(torch.equal(a.module.state_dict()[k], b.module.state_dict()[k]) for k in sa)

    other = CFG.model_copy(update={"n_expert": 8})
    with pytest.raises(WorkerError, match=r"different model shape.*n_expert: checkpoint 4 vs segment 8"):
        checkpoints.load(build_engine(build_model(other, seed=0), OPTIM), path, other)


def test_incomplete_checkpoint_is_not_resumed(tmp_path: Path, dist_group: None) -> None:
    eng = build_engine(build_model(CFG.dense(), seed=0), OPTIM)
    path = checkpoints.save(eng, tmp_path, 4, CFG.dense(), {"segment_id": "s"})
    (path / checkpoints.META_FILE).unlink()  # as if the job died before the sidecar was written
    assert checkpoints.complete(tmp_path, "s") == {}
    with pytest.raises(WorkerError, match="not a complete segment checkpoint"):
        checkpoints.read_meta(path)


def test_a_sidecar_from_before_an_option_is_the_model_at_its_default() -> None:
    older = {k: v for k, v in CFG.model_dump().items() if k not in ("balancing", "balancing_rate")}
    checkpoints.check_same_model({"model_config": older}, CFG, "old")
    with pytest.raises(WorkerError, match=r"balancing: checkpoint 'aux_loss' vs segment 'loss_free'"):
        checkpoints.check_same_model({"model_config": older}, CFG.updated(balancing="loss_free"), "old")
