"""`upscale slurm submit` without a SLURM: the batch script it writes (--dry-run) for the paper-scale spec on two
8-GPU nodes, and the bad input it refuses with one `error:` line before anything is written or submitted. The
real-SLURM runs are in tests/deploy/test_slurm.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.test_cli import UPSCALE
from tests.api.test_cli_errors import _fails
from upscale.api.cli.slurm_commands import node_local

ROOT = Path(__file__).resolve().parents[2]
PAPER_SPEC = ROOT / "sweeps" / "examples" / "liew-joint.yaml"  # resources: {cpus: 8, gpus: 1, workers: 8}
TWO_GPU_NODES = ["--nodes", "2", "--gpus-per-node", "8"]


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A folder that passes for shared (not under /tmp or on a tmpfs, wherever the checkout lies: CI may clone it
    into /tmp), holding a copy of the paper-scale spec; removed after the test."""
    for base in (ROOT / ".upscale", Path.home() / ".cache", Path("/var/lib")):
        folder = base / f"upscale-slurm-{tmp_path.name}"
        if not node_local(folder):
            folder.mkdir(parents=True)
            shutil.copy(PAPER_SPEC, folder / PAPER_SPEC.name)
            yield folder
            shutil.rmtree(folder, ignore_errors=True)
            return
    pytest.skip("no folder on this machine passes for a shared file system")


@pytest.fixture
def spec(shared: Path) -> Path:
    return shared / PAPER_SPEC.name


@pytest.fixture
def home(shared: Path) -> Path:
    """An UPSCALE_HOME on the shared folder that no test creates."""
    return shared / "home"


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "UPSCALE_HOME": str(home), **extra}


def test_the_dry_run_prints_the_script_for_two_gpu_nodes(spec: Path, home: Path) -> None:
    r = subprocess.run([UPSCALE, "slurm", "submit", str(spec), *TWO_GPU_NODES, "--time", "2-00:00:00",
                        "--partition", "gpu", "--account", "scaling", "--dry-run"],
                       env=_env(home), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    script = r.stdout
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8", "#SBATCH --cpus-per-task=64",
                 "#SBATCH --time=2-00:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=scaling",
                 "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300", f"export UPSCALE_SPEC={spec}",
                 f"export UPSCALE_HOME={home}", "ray start --head", 'upscale run "$UPSCALE_SPEC"'):
        assert line in script, line
    assert script.startswith("#!/bin/bash\n")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0  # it parses
    assert not home.exists()  # a dry run writes nothing


@pytest.mark.parametrize(("args", "says"), [
    (["--nodes", "1", "--gpus-per-node", "4"], "does not fit 1 node(s) of 32 CPUs and 4 GPUs: "
                                               "resources.cpus: a segment needs 64 cpus"),
    (["--nodes", "2", "--gpus-per-node", "0"], "resources.gpus: one worker needs 1 gpus; --gpus-per-node gives 0"),
    ([*TWO_GPU_NODES, "--cpus-per-node", "2"], "resources.cpus: one worker needs 8 cpus; --cpus-per-node gives 2"),
    (["--time", "tomorrow"], "--time 'tomorrow' is not a SLURM time"),
    ([*TWO_GPU_NODES, "--home", "/dev/shm/upscale"], "/dev/shm/upscale is on node-local scratch"),
])
def test_bad_input_is_one_line_and_writes_nothing(args: list[str], says: str, spec: Path, home: Path) -> None:
    line = _fails(_env(home), "slurm", "submit", str(spec), *args, "--dry-run")
    assert says in line, line
    assert not home.exists() and not Path("/dev/shm/upscale").exists()


def test_without_sbatch_it_says_where_to_run(spec: Path, home: Path) -> None:
    bare = str(Path(UPSCALE).parent)  # the venv's bin: upscale and python, no sbatch
    line = _fails(_env(home, PATH=bare), "slurm", "submit", str(spec), *TWO_GPU_NODES)
    assert "sbatch not found: run `upscale slurm submit` on a SLURM login node" in line
    assert not home.exists()
