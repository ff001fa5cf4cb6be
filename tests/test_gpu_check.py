"""The one-call device check (bench/gpu_check.py) in its dry-run mode on the CPU: every step runs at tiny sizes and
writes its JSON file, with the figures the GPU run reports in the same places (docs/gpu.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "bench" / "gpu_check.py"


def dry_run(out: Path, *only: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(CHECK), "dry-run", "--out", str(out), *(["--only", *only] if only else [])]
    return subprocess.run(argv, capture_output=True, text=True, timeout=900)


@pytest.mark.slow  # ~10 s: a subprocess that imports torch and runs `pip check`
def test_env_step_writes_its_record_and_the_summary(tmp_path: Path) -> None:
    done = dry_run(tmp_path, "env")
    assert done.returncode == 0, done.stdout + done.stderr
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["status"] == "ok" and env["step"] == "env"
    assert env["figures"]["torch"] and env["figures"]["cuda_available"] is False
    assert env["figures"]["versions"]["upscale"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok"] and list(summary["steps"]) == ["env"] and summary["mode"] == "dry-run"


@pytest.mark.slow
def test_dry_run_writes_every_step(tmp_path: Path) -> None:
    done = dry_run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(f"{s}.json" for s in ("env", "dispatch", "pytest", "throughput", "sweep", "moe_dispatch",
                                                  "summary"))
    step = {f[:-5]: json.loads((tmp_path / f).read_text()) for f in files}
    assert all(s["status"] == "ok" for name, s in step.items() if name != "summary"), step["summary"]
    dispatch = step["dispatch"]["figures"]
    assert dispatch["ok"] and dispatch["expert_layer"]["empty_experts"] == 3
    assert dispatch["expert_layer"]["grouped_bf16"]["empty_expert_grads_zero"]
    tests = step["pytest"]["figures"]
    assert tests["tests"] >= 1 and tests["skipped"] == tests["tests"]  # no CUDA here: every gpu test skips
    rows = step["throughput"]["figures"]["rows"]
    assert [r["name"] for r in rows] == ["dense", "moe8x2"] and all(r["ours"] > 0 and r["plain"] > 0 for r in rows)
    sweep = step["sweep"]["figures"]
    assert sweep["gpu_counts_agree"] and sweep["ray_gpus"] == 0 and sweep["observations"] > 0
    assert sweep["trained"]["segments"] > 0 and all(loss and loss > 0 for loss in sweep["losses"])
    moe = step["moe_dispatch"]["figures"]
    assert moe["headline_size"] == "nano" and moe["max_abs_diff"] < 1e-4
