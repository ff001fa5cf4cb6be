"""Two schedulers can end one sweep at the same moment; both log the same observations table to MLflow."""

from __future__ import annotations

import threading
from pathlib import Path

import pandas as pd

from upscale.orchestrator.tracking import RunTree


def test_two_writers_logging_one_table_at_once_both_succeed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    trees = [RunTree(uri, str(tmp_path / "artifacts")) for _ in range(2)]  # one client each, as two processes
    runs = [tree.start_sweep(f"sweep{i}", "race", {"name": "race"}) for i, tree in enumerate(trees)]
    errors: list[BaseException] = []
    for k in range(20):  # the window is short: a new table (a new dataset digest) each round reopens it
        table = pd.DataFrame({"kind": ["dense"], "loss": [3.0 + k]})
        barrier = threading.Barrier(2)

        def log(i: int, table: pd.DataFrame = table, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                trees[i].log_observations(runs[i], table)
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=log, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    for tree, run_id in zip(trees, runs, strict=True):  # each run is linked to all 20 tables
        assert len(tree.client.get_run(run_id).inputs.dataset_inputs) == 20
