"""Fixtures for the control layer's tests: settings rooted in a temporary UPSCALE_HOME with real SQLite and MLflow
files (embedded Ray and the MLflow store: tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def settings(tmp_path, mlflow_uri):
    from upscale.orchestrator.settings import Settings

    return Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)
