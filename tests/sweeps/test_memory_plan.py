"""Micro-batches and activation checkpointing in a spec: they change memory, never a segment's identity; the plan
says what one worker (one GPU) needs per size at the micro-batch it chooses, and refuses what cannot fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from upscale.sweeps import sizes
from upscale.sweeps.loader import load_spec
from upscale.sweeps.memory import GIB, check_memory, memory_plan, worker_memory
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import fingerprint
from upscale.sweeps.spec import SpecError, parse_spec

LIEW_JOINT = Path(__file__).resolve().parents[2] / "sweeps" / "examples" / "liew-joint.yaml"


def test_step_options_change_no_segment_and_no_default_spec_hash(spec_data: dict) -> None:
    base = parse_spec(spec_data)
    spec_data["train"] |= {"micro_batch_size": 2, "activation_checkpointing": True}
    spec_data["per_size"] = {"nano": {"micro_batch_size": 4}}
    tuned = parse_spec(spec_data)
    assert [s.id for s in plan(tuned).segments] == [s.id for s in plan(base).segments]
    assert fingerprint(base) == fingerprint(parse_spec({**spec_data, "train": {**spec_data["train"],
                                                        "micro_batch_size": None, "activation_checkpointing": False},
                                                        "per_size": {}}))
    assert tuned.micro_batch_size("nano") == 4


def test_a_micro_batch_must_divide_a_workers_share(spec_data: dict) -> None:
    spec_data["train"]["micro_batch_size"] = 3
    spec_data["resources"] = {"workers": 2}
    with pytest.raises(SpecError) as e:
        parse_spec(spec_data)
    assert list(e.value.problems) == [("train.micro_batch_size", "3 does not divide the 8 sequences each of 2 "
                                       "worker(s) takes per step of nano; use a divisor of 8")]


def test_liew_joint_fits_80_gib_gpus_with_accumulation() -> None:
    spec = load_spec(LIEW_JOINT)
    memory = worker_memory(spec)
    assert memory == 80 * GIB  # a GPU sweep without resources.gpu_memory: an H100's
    by_size = {m.label: m for m in memory_plan(spec, memory)}
    assert all(m.fits and m.rows % m.micro_batch_size == 0 for m in by_size.values())
    assert by_size["15M"].micro_batch_size == by_size["15M"].rows  # small models take the whole share at once
    assert by_size["1B"].micro_batch_size < by_size["1B"].rows
    assert by_size["1B"].model == "1B as 8x2"
    check_memory(spec)


def test_a_model_no_gpu_holds_is_refused_naming_the_knobs() -> None:
    spec = load_spec(LIEW_JOINT)
    small = spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpu_memory": 16.0})})
    with pytest.raises(SpecError) as e:
        check_memory(small)
    path, msg = e.value.problems[-1]  # 0.5B does not fit either
    assert path == "resources" and msg.startswith("1B as 8x2 needs about") and not msg.endswith("…")
    assert "train.activation_checkpointing: true" in msg and "resources.workers" in msg
    assert "resources.gpu_memory" in msg
    too_big = spec.model_copy(update={"train": spec.train.model_copy(update={"micro_batch_size": 64})})
    with pytest.raises(SpecError) as e:
        check_memory(too_big)
    assert ("train.micro_batch_size" in {p for p, _ in e.value.problems} and
            all("lower it" in m for _, m in e.value.problems))


def test_checkpointing_keeps_one_block_and_the_layer_inputs() -> None:
    shape = sizes.shape_of("0.1B")

    def need(checkpointing: bool) -> int:
        return sizes.training_memory(shape, 8, 2, shape.d_ff, 0, vocab=32000, context=1024, sequences=8,
                                     workers=8, checkpointing=checkpointing).activations

    per_layer = (8 + 2 + 3 * 2 * 4) * shape.d_model + 8  # floats per token: block, two of eight experts, router
    tokens, logits = 8 * 1024, 2 * 32000
    assert need(False) == 4 * tokens * (shape.n_layer * per_layer + logits)
    assert need(True) == 4 * tokens * (shape.n_layer * shape.d_model + per_layer + logits)


def test_expert_parallel_workers_hold_their_share_of_the_experts() -> None:
    shape = sizes.shape_of("1B")
    one, eight = (sizes.training_memory(shape, 8, 2, shape.d_ff, 0, vocab=32000, context=1024, sequences=1,
                                        workers=w) for w in (1, 8))
    experts = shape.n_layer * 8 * 3 * shape.d_model * shape.d_ff
    assert one.params - eight.params == experts - experts // 8
