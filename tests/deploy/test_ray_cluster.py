"""A multi-node Ray cluster on one machine (head with no CPUs + 2 worker nodes, `ray.cluster_utils.Cluster`) runs a
sweep through the orchestrator as a deployed API would (RAY_ADDRESS = ray://<head>, Ray Client): segments spread
across the worker nodes, and removing a node mid-sweep loses nothing: its segment resumes on the other node from the
checkpoint it left on the shared checkpoint directory, and every segment is trained to completion exactly once.

Strategy: the cluster and the sweep run in a child process (tests/deploy/cluster_sweep.py) so they never meet this
session's embedded Ray; it removes the node running the dense trunk (hard, no graceful drain) once that trunk has
written a resume checkpoint at >= 128 of its 448 tokens, then the test reads its outcome and the segments'
events (which node each start ran on, the token count each start resumed from). ~60 s on 2 busy cores: slow."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_segments_spread_over_nodes_and_a_removed_node_loses_nothing(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "tests.deploy.cluster_sweep", str(tmp_path), "kill"], cwd=ROOT,
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    events = [json.loads(line) for line in (tmp_path / "home" / "checkpoints" / "events.jsonl").read_text()
              .splitlines()]
    nodes = [e for e in events if e["event"] == "node"]
    starts = [e for e in events if e["event"] == "start"]

    assert outcome["status"] == "done" and len(outcome["trained"]) == 7 and outcome["observations"] == 3
    assert outcome["ray_client"]  # the scheduler drove the cluster through ray:// as in deploy/
    # a client (no GCS connection of its own) still sees the surviving nodes: the cluster is not reported down, and
    # a submission's resource check gets the workers' CPUs, not a 503 (the removed node's one may still count until
    # the GCS's health check marks it dead)
    assert outcome["ray_problem"] is None and outcome["cluster_cpus"] in (1, 2)
    # every segment trained to completion exactly once, whatever it took
    assert Counter(e["segment"] for e in events if e["event"] == "end") == Counter(set(outcome["trained"]))
    # spread: the two first segments ran at once, one per worker node; nothing ever ran on the head
    assert {nodes[0]["node"], nodes[1]["node"]} == set(outcome["workers"])
    assert outcome["head"] not in {e["node"] for e in nodes}
    # the removed node's trunk started twice: on the removed node from 0, then elsewhere from its checkpoint
    trunk, removed = outcome["trunk"], outcome["removed"]
    trunk_nodes = [e["node"] for e in nodes if e["segment"] == trunk]
    assert len(trunk_nodes) == 2 and trunk_nodes[0] == removed and trunk_nodes[1] != removed
    # the lost node's attempt is released, not counted against the segment's attempts
    assert outcome["attempts"][trunk] == ["node lost", "done"] and outcome["retried"] == 0
    resumed = [e["tokens"] for e in starts if e["segment"] == trunk]
    assert resumed[0] == 0 and len(resumed) == 2 and resumed[1] >= outcome["removed_at_tokens"] >= 128
    # after the removal everything ran on the surviving node
    second = [i for i, e in enumerate(nodes) if e["segment"] == trunk][1]
    assert {e["node"] for e in nodes[second:]} == set(outcome["workers"]) - {removed}
