"""MetricLogger against a real SQLite MLflow store: points are buffered and arrive complete, in batches; with no
tracking URI it does nothing."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from upscale.workers.tracking import MetricLogger


def test_metrics_are_buffered_then_all_arrive(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with MetricLogger(uri, None, {"kind": "dense_trunk", "n_expert": "0"}, run_name="t", flush_every=50) as log:
        client = MlflowClient(tracking_uri=uri)
        for step in range(20):
            log.log(step, loss=10.0 - step, lr=0.1)
        assert client.get_metric_history(log.run_id, "loss") == []  # 40 points, still buffered
        for step in range(20, 120):
            log.log(step, loss=10.0 - step, lr=0.1)
        assert 0 < len(client.get_metric_history(log.run_id, "loss")) < 120  # some batches sent, some buffered
    history = client.get_metric_history(log.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 10.0 - s) for s in range(120)]
    run = client.get_run(log.run_id)
    assert run.data.tags["kind"] == "dense_trunk" and run.info.status == "FINISHED"


def test_an_orchestrator_run_is_logged_into_and_left_open(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("sweep")).info.run_id
    with MetricLogger(uri, run_id, {"method": "naive"}, run_name="ignored") as log:
        log.log(5, val_loss=3.25)
    run = client.get_run(run_id)
    assert run.data.metrics["val_loss"] == 3.25 and run.data.tags["method"] == "naive"
    assert run.info.status == "RUNNING"


def test_no_tracking_uri_is_a_no_op() -> None:
    log = MetricLogger(None, None, {"a": "b"}, run_name="x")
    log.log(1, loss=1.0)
    log.close()
    assert log.client is None
