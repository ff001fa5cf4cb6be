"""A parent checkpoint whose files are damaged (a truncated engine state, a garbage sidecar, a truncated weights
export) fails its child at load with a WorkerError (never retried by the scheduler) that names the file and tells the
user to run `upscale segments invalidate <the parent>`, instead of a raw torch or JSON error retried three times.

Strategy: a real nano dense trunk trained for a few steps by run_segment saves its branch checkpoints; each test
copies one, damages one file, and runs the real child segment (a decay branch, or an upcycle) from the copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.workers.test_segment import MOE, TPS, rt, seg
from upscale.sweeps.segments import UpcycleSpec
from upscale.workers.errors import WorkerError
from upscale.workers.segment import run_segment

TRUNK = seg("dense_trunk", end_tokens=8 * TPS, save_at_tokens=(4 * TPS, 8 * TPS))
DECAY = seg("dense_decay", start_tokens=4 * TPS, end_tokens=6 * TPS, decay_start_tokens=4 * TPS,
            parent_ids=(TRUNK.id,))
UPCYCLE = seg("upcycle", model=MOE, start_tokens=8 * TPS, end_tokens=8 * TPS, parent_ids=(TRUNK.id,),
              upcycle=UpcycleSpec(method="naive"))


@pytest.fixture(scope="module")
def trunk(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    home = tmp_path_factory.mktemp("corrupt")
    result = run_segment(TRUNK, rt(home, TRUNK.id))
    return {tokens: Path(path) for tokens, path in result.branch_checkpoints.items()}


def damaged(trunk: dict[int, Path], tokens: int, file: str, tmp_path: Path, garbage: bytes | None = None) -> Path:
    """A copy of the trunk's checkpoint at ``tokens`` (under <root>/<trunk id>/, as the orchestrator lays them out)
    with ``file`` cut to half its size, or replaced by ``garbage``."""
    copy = tmp_path / TRUNK.id / trunk[tokens].name
    shutil.copytree(trunk[tokens], copy)
    target = copy / file
    target.write_bytes(garbage if garbage is not None else target.read_bytes()[: target.stat().st_size // 2])
    return copy


def child_error(spec, parent: Path, tmp_path: Path) -> str:
    with pytest.raises(WorkerError) as e:
        run_segment(spec, rt(tmp_path, "child", parent_checkpoints={TRUNK.id: str(parent)}))
    return str(e.value)


def test_a_truncated_engine_state_names_the_checkpoint_and_the_parent_to_invalidate(trunk, tmp_path) -> None:
    parent = damaged(trunk, 4 * TPS, "mp_rank_00_model_states.pt", tmp_path)
    message = child_error(DECAY, parent, tmp_path)
    assert str(parent) in message and "corrupt" in message
    assert f"upscale segments invalidate {TRUNK.id}" in message


def test_a_garbage_sidecar_names_the_file(trunk, tmp_path) -> None:
    parent = damaged(trunk, 4 * TPS, "meta.json", tmp_path, garbage=b"\x00\xffnot json")
    message = child_error(DECAY, parent, tmp_path)
    assert str(parent / "meta.json") in message
    assert f"upscale segments invalidate {TRUNK.id}" in message  # from the folder it sits in


def test_a_truncated_weights_export_names_the_file(trunk, tmp_path) -> None:
    parent = damaged(trunk, 8 * TPS, "model/weights.pt", tmp_path)
    message = child_error(UPCYCLE, parent, tmp_path)
    assert "weights.pt" in message and f"upscale segments invalidate {TRUNK.id}" in message


def test_an_intact_checkpoint_still_trains_its_child(trunk, tmp_path) -> None:
    copy = tmp_path / TRUNK.id / trunk[4 * TPS].name
    shutil.copytree(trunk[4 * TPS], copy)
    result = run_segment(DECAY, rt(tmp_path, "child", parent_checkpoints={TRUNK.id: str(copy)}))
    assert result.tokens == 2 * TPS and result.val_loss is not None
