"""A small valid sweep spec as plain data, for tests that change one field at a time."""

import copy

import pytest

SMALL_SPEC = {
    "name": "small",
    "model": {"sizes": ["nano"]},
    "moe": {"experts": [4], "topk": [2]},
    "upcycling": {"methods": ["naive"], "r": [0.5]},
    "tokens": {"d1": [20480, 40960], "d2": [20480, 40960]},  # 10 and 20 steps of 16 x 128 tokens
    "train": {"context": 128, "batch_size": 16, "lr": {"dense": 3e-3, "moe": 2e-3}, "warmup_tokens": 4096},
}


@pytest.fixture
def spec_data() -> dict:
    """A fresh deep copy of SMALL_SPEC to modify."""
    return copy.deepcopy(SMALL_SPEC)
