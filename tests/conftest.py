"""Fixtures shared by every test area."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray for the whole session (2 CPUs, as the machine has), started once whichever area needs it
    first: a second `ray.init` in one process is an error, so no area starts its own.

    `address="local"` never joins a Ray that another process started on this host. The orchestrator's test segment
    function is not an installed module, so it ships to workers by value.
    """
    import ray
    from ray import cloudpickle

    from tests.orchestrator import segment_fns

    cloudpickle.register_pickle_by_value(segment_fns)
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    """One MLflow SQLite store for the session: creating its schema takes seconds, so tests share it."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
