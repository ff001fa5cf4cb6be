"""Shared fixtures for worker tests: one thread, a tiny dense model, calibration tokens, a process group.

Shapes stay tiny (d_model <= 64, 2 layers) so the whole worker suite runs in seconds on 2 shared cores.
"""

from __future__ import annotations

import pytest
import torch

from upscale.workers.model import ModelConfig, UpscaleLM, build_model

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def dist_group() -> None:
    """A single-process gloo group (what DeepSpeed's engine needs); initialised once per test session."""
    from upscale.workers.distributed import init_single_process

    init_single_process()


@pytest.fixture(scope="session")
def dense_cfg() -> ModelConfig:
    return ModelConfig(n_layer=2, d_model=32, n_head=2, vocab_size=64, context=16)


@pytest.fixture(scope="session")
def dense_model(dense_cfg: ModelConfig) -> UpscaleLM:
    return build_model(dense_cfg, seed=0).eval()


@pytest.fixture(scope="session")
def dense_sd(dense_model: UpscaleLM) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in dense_model.state_dict().items()}


@pytest.fixture(scope="session")
def tokens(dense_cfg: ModelConfig) -> torch.Tensor:
    """A fixed batch [8, 16] of token ids: the logits probe and the calibration data."""
    return torch.randint(0, dense_cfg.vocab_size, (8, dense_cfg.context), generator=torch.Generator().manual_seed(7))

