"""Driver for tests/deploy/test_ray_cluster.py, run as its own process (`python -m tests.deploy.cluster_sweep DIR
MODE`) so that its Ray cluster never meets the embedded Ray of the rest of the test session.

It starts a multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head with no CPUs, as in
deploy/, and two worker nodes with one CPU each), then runs the micro sweep through the orchestrator with
RAY_ADDRESS set to the cluster, exactly as a deployed API would. The segment function is the counting one from
tests/orchestrator, wrapped to record which node ran each start. The driver connects as the deployed API does,
through the head's Ray Client server (RAY_ADDRESS=ray://...). MODE `spread` just runs the sweep; MODE `kill`
removes the node running the dense trunk once that trunk has written a resume checkpoint, mid-sweep. Writes
DIR/outcome.json; the events are in DIR/home/checkpoints/events.jsonl."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import ray
import ray.util.client
from ray import cloudpickle
from ray.cluster_utils import Cluster

from tests.deploy import conftest
from tests.orchestrator import segment_fns
from upscale.orchestrator.scheduler import Scheduler, cluster_resources, ensure_ray, ray_problem
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import Settings
from upscale.sweeps.loader import load_spec
from upscale.sweeps.segments import SegmentResult, SegmentRuntime, SegmentSpec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_segment(spec: SegmentSpec, runtime: SegmentRuntime) -> SegmentResult:
    """The counting segment, after logging the Ray node this start runs on."""
    root = Path(runtime.checkpoint_dir).parent
    segment_fns.log_event(root, event="node", segment=spec.id, kind=spec.kind,
                          node=ray.get_runtime_context().get_node_id())
    return segment_fns.counting_segment(spec, runtime)


def main(out: Path, mode: str) -> None:
    cloudpickle.register_pickle_by_value(segment_fns)  # not an installed package: ship it to the nodes by value
    # The client server the head's proxier spawns for a new client must answer within this many seconds (Ray's
    # default, 30, is too short for a Python process importing Ray on 2 busy cores); inherited by the head.
    os.environ["RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S"] = "240"
    client_port = free_port()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "ray_client_server_port": client_port})
    workers = {}
    for _ in range(2):
        node = cluster.add_node(num_cpus=1)
        workers[node.node_id] = node
    cluster.wait_for_nodes()
    # The deployed API is no Ray node: it drives the cluster through the head's Ray Client server (deploy/).
    settings = Settings(home=out / "home", ray_address=f"ray://127.0.0.1:{client_port}",
                        mlflow_tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    for attempt in range(3):  # Ray's proxier now and then loses the client server it forks for a new client (the
        # process exits at once: "SpecificServer startup failed"); the deployed API's supervised loops retry likewise
        try:
            ensure_ray(settings)
            break
        except ConnectionError:
            ray.shutdown()
            if attempt == 2:
                raise
    root = Path(settings.checkpoint_dir)
    root.mkdir(parents=True)
    (root / "knobs.json").write_text(json.dumps({"step_s": 0.4 if mode == "kill" else 0.02}))
    orch = Orchestrator.open(settings)
    spec = load_spec(conftest.MICRO_SPEC)
    sweep = orch.submit(spec)
    scheduler = Scheduler(orch.store, settings, segment_fn=node_segment, poll_s=0.1, checkpoint_every_tokens=64)
    outcome: dict = {"workers": sorted(workers), "head": cluster.head_node.node_id}
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=scheduler.run(sweep.id)))
    t0 = time.monotonic()
    thread.start()
    if mode == "kill":
        trunk = next(p for p in orch.store.members(sweep.id) if p[0].kind == "dense_trunk")[0].key
        resume = root / trunk / "resume.json"
        while not (resume.exists() and json.loads(resume.read_text())["tokens"] >= 128):
            if time.monotonic() - t0 > 240 or not thread.is_alive():
                raise RuntimeError("the dense trunk never wrote its resume checkpoint")
            time.sleep(0.05)
        events = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]
        victim = next(e["node"] for e in events if e["event"] == "node" and e["segment"] == trunk)
        outcome |= {"removed": victim, "trunk": trunk, "removed_at_tokens": json.loads(resume.read_text())["tokens"]}
        cluster.remove_node(workers[victim], allow_graceful=False)
    thread.join(timeout=400)
    sweep_out = result["out"]
    outcome |= {"status": sweep_out.status, "trained": sweep_out.trained, "retried": sweep_out.retried,
                "wall_s": time.monotonic() - t0, "sweep_id": sweep.id,
                "attempts": {k: [a.status for a in orch.store.attempts(k)] for k in sweep_out.trained},
                "observations": len(orch.store.observations(sweep.id)),
                "ray_client": ray.util.client.ray.is_connected(),
                # asked through the client server, as the deployed API asks before it accepts a sweep
                "ray_problem": ray_problem(settings), "cluster_cpus": cluster_resources(settings).cpus}
    (out / "outcome.json").write_text(json.dumps(outcome))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
