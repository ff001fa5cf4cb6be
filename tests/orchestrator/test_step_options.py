"""A stored sweep's micro-batch and activation checkpointing reach the segments it launches (per size)."""

from __future__ import annotations

import copy

from tests.sweeps.conftest import SMALL_SPEC
from upscale.orchestrator.scheduler import step_options
from upscale.sweeps.spec import parse_spec


def test_step_options_per_size() -> None:
    spec_data = copy.deepcopy(SMALL_SPEC)
    spec_data["model"]["sizes"] = ["nano", "micro"]
    spec_data["train"] |= {"micro_batch_size": 8, "activation_checkpointing": True}
    spec_data["per_size"] = {"micro": {"micro_batch_size": 4}}
    stored = parse_spec(spec_data).model_dump(mode="json")
    assert step_options(stored, "nano") == {"micro_batch_size": 8, "activation_checkpointing": True}
    assert step_options(stored, "micro") == {"micro_batch_size": 4, "activation_checkpointing": True}
    del spec_data["train"]["micro_batch_size"], spec_data["train"]["activation_checkpointing"], spec_data["per_size"]
    plain = parse_spec(spec_data).model_dump(mode="json")
    assert step_options(plain, "nano") == {"micro_batch_size": None, "activation_checkpointing": False}
