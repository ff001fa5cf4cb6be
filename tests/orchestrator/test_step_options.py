"""A stored sweep's micro-batch, activation checkpointing and validation cadence reach the segments it launches (per
size); the cadence is rounded to whole steps of each size as budgets are, and changes no segment's identity."""

from __future__ import annotations

import copy

import pytest

from tests.sweeps.conftest import SMALL_SPEC
from upscale.orchestrator.scheduler import step_options
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import fingerprint
from upscale.sweeps.spec import SpecError, parse_spec


def test_step_options_per_size() -> None:
    spec_data = copy.deepcopy(SMALL_SPEC)
    spec_data["model"]["sizes"] = ["nano", "micro"]
    spec_data["train"] |= {"micro_batch_size": 8, "activation_checkpointing": True, "eval_every_tokens": 8192}
    spec_data["per_size"] = {"micro": {"micro_batch_size": 4}}
    stored = parse_spec(spec_data).model_dump(mode="json")
    assert step_options(stored, "nano") == {"micro_batch_size": 8, "activation_checkpointing": True,
                                            "eval_every_tokens": 8192}
    assert step_options(stored, "micro") == {"micro_batch_size": 4, "activation_checkpointing": True,
                                             "eval_every_tokens": 8192}
    del spec_data["train"]["micro_batch_size"], spec_data["train"]["activation_checkpointing"], spec_data["per_size"]
    del spec_data["train"]["eval_every_tokens"]
    plain = parse_spec(spec_data).model_dump(mode="json")
    assert step_options(plain, "nano") == {"micro_batch_size": None, "activation_checkpointing": False,
                                           "eval_every_tokens": None}


def test_the_validation_cadence_is_whole_steps_of_each_size_and_no_part_of_any_identity() -> None:
    spec_data = copy.deepcopy(SMALL_SPEC)
    spec_data["model"]["sizes"] = ["nano", "micro"]
    spec_data["per_size"] = {"micro": {"batch_size": 8}}  # steps of 2048 tokens (nano) and 1024 (micro)
    base = parse_spec(spec_data)
    spec_data["train"]["eval_every_tokens"] = 5000  # 2.44 steps of nano -> 2, 4.88 of micro -> 5
    every = parse_spec(spec_data)
    assert [s.id for s in plan(every).segments] == [s.id for s in plan(base).segments]
    assert fingerprint(base) == fingerprint(parse_spec({**spec_data, "train": {**spec_data["train"],
                                                                               "eval_every_tokens": None}}))
    stored = every.model_dump(mode="json")
    assert step_options(stored, "nano")["eval_every_tokens"] == 4096
    assert step_options(stored, "micro")["eval_every_tokens"] == 5120
    assert "train.eval_every_tokens (nano): 5000 -> 4096 tokens (2 steps of 2048)" in plan(every).notes
    spec_data["train"]["round_tokens"] = "exact"
    with pytest.raises(SpecError) as e:
        parse_spec(spec_data)
    assert ("train.eval_every_tokens", "nano: 5000 tokens is not a whole number of steps of 2048 (batch_size*"
            "context); use 4096 or 6144, or set train.round_tokens: nearest") in e.value.problems
    spec_data["train"] |= {"round_tokens": "nearest", "eval_every_tokens": 500}
    with pytest.raises(SpecError) as e:
        parse_spec(spec_data)
    assert ("train.eval_every_tokens", "nano: 500 tokens is less than one step of 2048 tokens") in e.value.problems
