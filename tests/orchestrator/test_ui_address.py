"""The address `upscale demo` prints for the MLflow UI opens the experiment that holds the sweeps' runs, not MLflow's
landing page (its generic "Welcome" cards)."""

from __future__ import annotations

from pathlib import Path

from upscale.orchestrator.settings import Settings
from upscale.orchestrator.tracking import RunTree, ui_address


def test_the_ui_address_opens_the_experiment_of_the_sweeps_runs(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, mlflow_tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    tree = RunTree.for_settings(settings)
    run_id = tree.start_sweep("0123456789ab", "demo", {"name": "demo"})
    experiment = tree.client.get_run(run_id).info.experiment_id
    assert ui_address(settings) == f"http://127.0.0.1:5000/#/experiments/{experiment}"
    assert ui_address(settings, port=5050).startswith("http://127.0.0.1:5050/#/experiments/")
