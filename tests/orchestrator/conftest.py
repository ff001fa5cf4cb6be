"""Fixtures for the orchestrator tests: a tiny sweep planned by the real planner, and settings rooted in a temporary
UPSCALE_HOME with real SQLite and MLflow files (embedded Ray and the MLflow store: tests/conftest.py)."""

from __future__ import annotations

import pytest

TINY_SPEC = """
name: tiny
model: {sizes: [nano]}
moe: {experts: [4], topk: [1]}
upcycling: {methods: [naive, drop], r: [0.5]}
tokens: {d1: [512, 1024], d2: [256, 512], scratch: [512]}
train: {context: 16, batch_size: 4, lr: {dense: 3.0e-3, moe: 2.0e-3}, warmup_tokens: 64}
resources: {cpus: 1}
"""
# TINY_SPEC's naive half, without scratch runs: every segment of it is one of TINY_SPEC's (a grid that then grows)
TINY_NAIVE_SPEC = (TINY_SPEC.replace("name: tiny", "name: tiny-naive").replace("methods: [naive, drop]",
                                                                               "methods: [naive]")
                   .replace(", scratch: [512]", ""))


@pytest.fixture
def settings(tmp_path, mlflow_uri):
    from upscale.orchestrator.settings import Settings

    return Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)
