"""The MLflow UI that `upscale ui` runs: MLflow's own server, opening in its model-training view.

MLflow 3's UI picks between its GenAI view (traces, token usage, an assistant) and its model-training view (runs,
charts) from the page's `workflowType` URL parameter, else from the browser's local storage
(`mlflow.workflowType_v1`), else GenAI: a fresh browser lands on empty trace panels whatever the experiment's kind tag
says, beside an assistant panel that opens by itself. This app is MLflow's (registered as the `mlflow.app` plugin
`upscale`, run with `mlflow ui --app-name upscale`); it only adds to its landing page a line that sets model
training as the view, the assistant as shut and the runs table's columns (the final loss among them) where the
browser has chosen nothing. A user's own choice (the view
switch in the UI) stays theirs. Links upscale writes carry the parameter as well (workers/tracking.py `run_link`),
so they open in that view from any MLflow server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from upscale.workers.tracking import MODEL_TRAINING_VIEW

# The browser settings a fresh profile starts with, by MLflow's local-storage keys (the setting's name, "_v", its
# version): the model-training view, and the assistant panel counted as already auto-opened once, so it stays shut.
DEFAULTS = {"mlflow.workflowType_v1": MODEL_TRAINING_VIEW, "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True}
# The runs table's columns an experiment opens with, where the browser has kept no view of it: each run's final
# validation loss (the observation, for a decay) beside the datasets, instead of MLflow's Source, Models and Dataset.
# MLflow keeps an experiment page's view under a key naming its experiments (`...-ExperimentPage-["1"]-...`), so the
# default is what reading such a key gives while it is unset, for any experiment.
RUNS_TABLE_COLUMNS = ["metrics.`summary/val_loss`", "attributes.`Dataset`"]
EXPERIMENT_VIEW_KEY = r"^MLflowLocalStorage-[^-]+-ExperimentPage-.*-ReactComponentState$"
DEFAULTS_SCRIPT = "<script>try{" + "".join(
    f"if(!localStorage.getItem({json.dumps(k)}))localStorage.setItem({json.dumps(k)},{json.dumps(json.dumps(v))});"
    for k, v in DEFAULTS.items()) + (
    "var get=Storage.prototype.getItem;"
    f"Storage.prototype.getItem=function(k){{var v=get.call(this,k);return v===null&&/{EXPERIMENT_VIEW_KEY}/.test(k)"
    f"?{json.dumps(json.dumps({'selectedColumns': RUNS_TABLE_COLUMNS}))}:v}};") + "}catch(e){}</script>"


def landing_page(index_html: str) -> str:
    """MLflow's index.html with the defaults' line first in its head, so it runs before the app reads them."""
    return index_html.replace("<head>", "<head>" + DEFAULTS_SCRIPT, 1)


def create_app() -> Any:
    """The ASGI app `mlflow ui --app-name upscale` serves: MLflow's, its landing page served by `landing_page`."""
    from flask import Response
    from mlflow.server import app as flask_app
    from mlflow.server.fastapi_app import create_fastapi_app

    index = Path(flask_app.static_folder) / "index.html"

    def serve() -> Response:
        return Response(landing_page(index.read_text()), mimetype="text/html")

    flask_app.view_functions["serve"] = serve
    return create_fastapi_app(flask_app)
