"""MetricLogger against a real SQLite MLflow store: points are buffered and arrive complete, in batches, under the
chart names that put the losses first in MLflow's UI; a run it creates alone gets its name, params and tags and an
experiment in the model-training view with its artifacts beside the store; a resumed attempt logs no step twice;
with no tracking URI it does nothing."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from upscale.workers.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, MetricLogger, artifact_root_for, chart_name


def test_metrics_are_buffered_then_all_arrive(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with MetricLogger(uri, None, run_name="t", params={"kind": "dense_trunk"}, tags={"upscale.segment_id": "s"},
                      flush_every=50) as log:
        client = MlflowClient(tracking_uri=uri)
        for step in range(20):
            log.log(step, {"train_loss": 10.0 - step, "lr": 0.1})
        assert client.get_metric_history(log.run_id, "loss/train") == []  # 40 points, still buffered
        for step in range(20, 120):
            log.log(step, {"train_loss": 10.0 - step, "lr": 0.1})
        assert 0 < len(client.get_metric_history(log.run_id, "loss/train")) < 120  # some batches sent, some buffered
    history = client.get_metric_history(log.run_id, "loss/train")
    assert sorted((m.step, m.value) for m in history) == [(s, 10.0 - s) for s in range(120)]
    run = client.get_run(log.run_id)
    assert run.data.params == {"kind": "dense_trunk"} and run.data.tags["upscale.segment_id"] == "s"
    assert run.info.run_name == "t" and run.info.status == "FINISHED"
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert experiment.artifact_location == (tmp_path / "mlartifacts").as_uri()  # beside the store, not ./mlruns


def test_chart_names_put_losses_before_expert_load() -> None:
    names = [chart_name(k) for k in ("train_loss", "val_loss", "load/layer0/expert1", "aux_loss", "lr",
                                     "tokens_per_s")]
    assert names == ["loss/train", "loss/val", "moe/load/layer0/expert1", "moe/aux_loss", "optim/lr",
                     "speed/tokens_per_s"]
    # MLflow's UI orders sections (the prefix before the last '/') alphabetically: the losses' comes first
    sections = sorted({n.rsplit("/", 1)[0] for n in names})
    assert sections[0] == "loss"


def test_an_orchestrator_run_is_logged_into_and_left_open(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("sweep")).info.run_id
    with MetricLogger(uri, run_id, run_name="ignored", params={"kind": "x"}, tags={"a": "b"}) as log:
        log.log(5, {"val_loss": 3.25})
    run = client.get_run(run_id)
    assert run.data.metrics["loss/val"] == 3.25 and run.info.status == "RUNNING"
    assert run.data.params == {} and "a" not in run.data.tags  # its creator described it


def test_a_resumed_attempt_does_not_log_the_steps_the_run_already_holds(tmp_path: Path) -> None:
    """The first attempt logged steps 0..50 and died; the retry resumes from its checkpoint at step 30 and trains
    30..80 again: the history is each step once, in order."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("sweep")).info.run_id
    with MetricLogger(uri, run_id, run_name="segment") as first:
        for step in range(0, 51, 10):
            first.log(step, {"train_loss": 1.0})
    with MetricLogger(uri, run_id, run_name="segment") as retry:
        for step in range(30, 81, 10):
            retry.log(step, {"train_loss": 2.0})
    history = client.get_metric_history(run_id, "loss/train")
    assert sorted((m.step, m.value) for m in history) == \
        [(s, 1.0) for s in range(0, 51, 10)] + [(60, 2.0), (70, 2.0), (80, 2.0)]


def test_artifacts_of_a_sqlite_store_go_beside_it_and_a_server_keeps_its_own() -> None:
    assert artifact_root_for("sqlite:////data/h/mlflow.db") == "file:///data/h/mlartifacts"
    assert artifact_root_for("http://127.0.0.1:5000") is None


def test_no_tracking_uri_is_a_no_op() -> None:
    log = MetricLogger(None, None, run_name="x", tags={"a": "b"})
    log.log(1, {"loss": 1.0})
    log.close()
    assert log.client is None
