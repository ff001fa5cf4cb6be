"""The MLflow UI `upscale ui` runs (api/mlflow_ui.py): MLflow's own app, found through the `mlflow.app` plugin
`upscale`, whose landing page makes a fresh browser open in the model-training view with the assistant shut, and
leaves a browser's own choice alone."""

from __future__ import annotations

import json
import re

from fastapi.testclient import TestClient
from mlflow.utils.plugins import get_entry_points

from upscale.api import mlflow_ui


def test_mlflow_finds_the_upscale_app_and_its_landing_page_sets_the_defaults_first(tmp_path, monkeypatch) -> None:
    # the store and artifact root, as `mlflow ui` hands them to its server process
    monkeypatch.setenv("_MLFLOW_SERVER_FILE_STORE", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("_MLFLOW_SERVER_ARTIFACT_ROOT", (tmp_path / "mlartifacts").as_uri())
    (entry,) = [e for e in get_entry_points("mlflow.app") if e.name == "upscale"]  # `--app-name upscale` resolves
    assert entry.load() is mlflow_ui.create_app
    with TestClient(mlflow_ui.create_app(), base_url="http://localhost") as client:  # MLflow serves localhost
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        head = page.text.split("</head>")[0]
        scripts = re.findall(r"<script[^>]*>(.*?)</script>|<script[^>]*src=", head)
        assert scripts[0].startswith("try{") and "src" not in head.split(scripts[0])[0]  # before MLflow's own script
        sets = dict(re.findall(r'localStorage\.setItem\(("[^"]+"),("(?:[^"\\]|\\.)*")\)', scripts[0]))
        # each value is stored as MLflow stores it: JSON text, read back with JSON.parse
        assert {json.loads(k): json.loads(json.loads(v)) for k, v in sets.items()} == {
            "mlflow.workflowType_v1": "machine_learning", "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True}
        for key in sets:  # set only where the browser has no value: a user's own choice stays
            assert f"if(!localStorage.getItem({key}))localStorage.setItem({key}," in scripts[0]
        # an experiment the browser keeps no view of opens with the final loss as a runs-table column
        (view,) = re.findall(r'v===null&&/(.+?)/\.test\(k\)\?("(?:[^"\\]|\\.)*"):v', scripts[0])
        assert re.match(view[0], 'MLflowLocalStorage-1.1-ExperimentPage-["7"]-ReactComponentState')
        assert "metrics.`summary/val_loss`" in json.loads(json.loads(view[1]))["selectedColumns"]
        # the rest is MLflow's app: its API answers through the same server
        found = client.get("/ajax-api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": "Default"})
        assert found.status_code == 200 and found.json()["experiment"]["experiment_id"] == "0"


def test_links_upscale_writes_open_in_the_same_view() -> None:
    from upscale.workers.tracking import run_link

    assert run_link("3", "abc") == "#/experiments/3/runs/abc?workflowType=machine_learning"
    assert mlflow_ui.DEFAULTS["mlflow.workflowType_v1"] == "machine_learning"
