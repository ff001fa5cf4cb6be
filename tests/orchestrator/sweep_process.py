"""Run one sweep in its own process, as `upscale run` would, with the test segment function: the subject of the
kill-and-restart test. Usage: python sweep_process.py HOME MLFLOW_URI SWEEP_ID"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # segment_fns

import ray
import segment_fns
from ray import cloudpickle

from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import Settings

if __name__ == "__main__":
    home, mlflow_uri, sweep_id = sys.argv[1:4]
    cloudpickle.register_pickle_by_value(segment_fns)
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    orch = Orchestrator.open(Settings(home=home, mlflow_tracking_uri=mlflow_uri))
    out = Scheduler(orch.store, orch.settings, segment_fn=segment_fns.counting_segment, poll_s=0.05,
                    checkpoint_every_tokens=64).run(sweep_id)
    print(out.status, len(out.trained), len(out.adopted))
