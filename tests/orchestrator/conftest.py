"""Fixtures for the orchestrator tests: one embedded Ray per session (2 CPUs, as the machine has), a tiny sweep
planned by the real planner, and settings rooted in a temporary UPSCALE_HOME with real SQLite and MLflow files."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

TINY_SPEC = """
name: tiny
model: {sizes: [nano]}
moe: {experts: [4], topk: [1]}
upcycling: {methods: [naive, drop], r: [0.5]}
tokens: {d1: [512, 1024], d2: [256, 512], scratch: [512]}
train: {context: 16, batch_size: 4, lr: {dense: 3.0e-3, moe: 2.0e-3}, warmup_tokens: 64}
resources: {cpus: 1}
"""


@pytest.fixture(scope="session")
def ray_session():
    import ray
    from ray import cloudpickle

    from tests.orchestrator import segment_fns

    # The test segment function lives outside any installed package: ship it to workers by value.
    cloudpickle.register_pickle_by_value(segment_fns)
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    """One MLflow SQLite store for the session: creating its schema takes seconds, so tests share it."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def settings(tmp_path, mlflow_uri):
    from orchestrator.settings import Settings

    return Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)
