"""`upscale slurm submit`: run a sweep on a SLURM cluster, with Ray inside the allocation.

The batch script is deploy/slurm/upscale.sbatch (packaged as api/cli/slurm.sbatch): its job body starts Ray the way
Ray's "Deploying on Slurm" documents and runs `upscale run SPEC` against UPSCALE_HOME, a folder every node mounts.
This command writes the script's #SBATCH lines and variables for a spec, refuses what cannot run (the spec's segments
do not fit the nodes asked for, a node-local UPSCALE_HOME, a malformed time) before anything is written, and hands
the script to `sbatch` on its stdin, so a job SLURM rejects (an unknown partition or account) leaves nothing behind.
The sweep lands in the store under UPSCALE_HOME: `upscale status` with the same UPSCALE_HOME shows it.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from upscale.api.cli.app import CommandError, console, err_console

if TYPE_CHECKING:
    from upscale.sweeps.spec import SweepSpec

slurm_app = typer.Typer(help="Run a sweep on a SLURM cluster: Ray inside the allocation (deploy/slurm/).",
                        no_args_is_help=True)

BODY_MARKER = "# ==== job body"
# SLURM's --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
TIME_FORMAT = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2})$")
# Folders that are each node's own disk or memory on every cluster we know of.
NODE_LOCAL_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/scratch/local", "/local")
NODE_LOCAL_FILESYSTEMS = {"tmpfs", "ramfs", "devtmpfs"}
REQUEUE_WARNING_S = 300  # --signal=B:USR1@this: the script requeues itself this long before the time limit


def job_body() -> str:
    """Everything of the template from its body marker on: what runs in the allocation."""
    text = (resources.files("upscale.api.cli") / "slurm.sbatch").read_text()
    return text[text.index(BODY_MARKER):]


def _mount_type(path: Path) -> str:
    """The file-system type of the mount holding ``path`` (the longest mount point above it in /proc/mounts)."""
    best, kind = "", ""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (str(path) == point or str(path).startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def node_local(path: Path) -> bool:
    """Whether ``path`` is on node-local scratch (a tmpfs, /tmp, $TMPDIR...): another node cannot see it."""
    local_dirs = [*NODE_LOCAL_DIRS, *(os.environ[v] for v in ("TMPDIR", "SLURM_TMPDIR") if os.environ.get(v))]
    under = any(path == Path(d).resolve() or Path(d).resolve() in path.parents for d in local_dirs)
    return under or _mount_type(path) in NODE_LOCAL_FILESYSTEMS


def check_fits(spec: SweepSpec, nodes: int, cpus_per_node: int, gpus_per_node: int) -> None:
    """Refuse, in one line, a spec whose segments need more than the allocation gives: one worker process lives on
    one node; a segment's workers may span the nodes."""
    from upscale.sweeps.errors import SpecError
    from upscale.sweeps.resources import ClusterResources, check_resources

    r = spec.resources
    problems = [f"resources.{name}: one worker needs {per:g} {name}; {option} gives {have}"
                for name, per, option, have in (("cpus", r.cpus, "--cpus-per-node", cpus_per_node),
                                                ("gpus", r.gpus, "--gpus-per-node", gpus_per_node)) if per > have]
    try:
        check_resources(spec, ClusterResources(cpus=nodes * cpus_per_node, gpus=nodes * gpus_per_node))
    except SpecError as e:
        problems += [f"{path}: {msg}" for path, msg in e.problems]
    if problems:
        raise CommandError(f"the spec does not fit {nodes} node(s) of {cpus_per_node} CPUs and {gpus_per_node} GPUs: "
                           f"{'; '.join(problems)}; ask for more --nodes, --gpus-per-node or --cpus-per-node")


def batch_script(spec_path: Path, spec: SweepSpec, home: Path, nodes: int, cpus_per_node: int, gpus_per_node: int,
                 time: str, partition: str | None, account: str | None) -> str:
    """The batch script for ``spec``: its #SBATCH lines, its variables and the template's job body."""
    sbatch = [f"--job-name=upscale-{spec.name}", f"--nodes={nodes}", "--ntasks-per-node=1",
              f"--cpus-per-task={cpus_per_node}", *([f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else []),
              f"--time={time}", *([f"--partition={partition}"] if partition else []),
              *([f"--account={account}"] if account else []), "--requeue", f"--signal=B:USR1@{REQUEUE_WARNING_S}",
              "--open-mode=append", f"--output={home / 'slurm' / '%x-%j.out'}", "--export=ALL"]
    variables = {"UPSCALE_SPEC": spec_path, "UPSCALE_HOME": home, "UPSCALE_BIN": Path(sys.executable).parent}
    return "\n".join(["#!/bin/bash",
                      f"# `upscale slurm submit {spec_path.name}`: sweep {spec.name} on {nodes} node(s). The job "
                      "body is deploy/slurm/upscale.sbatch's, which documents every knob.",
                      *(f"#SBATCH {line}" for line in sbatch),
                      *(f"export {k}={shlex.quote(str(v))}" for k, v in variables.items()),
                      job_body()])


@slurm_app.command("submit")
def submit_command(
    spec: Annotated[Path, typer.Argument(help="Sweep spec, YAML or JSON, on a path every node reads.")],
    nodes: Annotated[int, typer.Option(min=1, help="Nodes of the allocation: the Ray head on the first, "
                                       "workers on the rest.")] = 1,
    gpus_per_node: Annotated[int | None, typer.Option(min=0, help="GPUs per node; default: what one segment "
                                                      "needs (resources.gpus x workers).")] = None,
    cpus_per_node: Annotated[int | None, typer.Option(min=1, help="CPUs per node; default: resources.cpus for "
                                                      "each worker the node's GPUs hold (one on CPU).")] = None,
    time: Annotated[str, typer.Option(help="Time limit, SLURM's form (HH:MM:SS, D-HH:MM...); near it the job "
                                      "requeues itself and resumes the sweep.")] = "24:00:00",
    partition: Annotated[str | None, typer.Option(help="SLURM partition; default: the cluster's.")] = None,
    account: Annotated[str | None, typer.Option(help="SLURM account to charge; default: yours.")] = None,
    home: Annotated[Path | None, typer.Option(help="UPSCALE_HOME of the job, a folder on a file system every node "
                                              "mounts (store, checkpoints, MLflow, logs); default: UPSCALE_HOME.")]
    = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the batch script; submit nothing.")] = False,
) -> None:
    """Fill in the batch script for SPEC and submit it with sbatch; print the job id. `upscale status` (with the
    same UPSCALE_HOME) shows the sweep; a requeued or resubmitted job resumes it."""
    from upscale.orchestrator.settings import get_settings
    from upscale.sweeps.loader import load_spec

    spec_path = spec.resolve()
    sweep = load_spec(spec_path)
    r = sweep.resources
    gpus = math.ceil(r.gpus * r.workers) if gpus_per_node is None else gpus_per_node
    cpus = cpus_per_node or math.ceil(r.cpus) * (int(gpus // r.gpus) if r.gpus and gpus >= r.gpus else 1)
    job_home = (home or get_settings().home).resolve()
    if not TIME_FORMAT.match(time):
        raise CommandError(f"--time {time!r} is not a SLURM time; give minutes, HH:MM:SS or D-HH:MM:SS")
    check_fits(sweep, nodes, cpus, gpus)
    if nodes > 1:
        for what, path in (("--home (UPSCALE_HOME)", job_home), ("the spec", spec_path)):
            if node_local(path):
                raise CommandError(f"{what} {path} is on node-local scratch, which the other nodes cannot see; "
                                   "choose a folder on a shared file system")
    script = batch_script(spec_path, sweep, job_home, nodes, cpus, gpus, time, partition, account)
    if dry_run:
        print(script, end="")
        return
    if shutil.which("sbatch") is None:
        raise CommandError("sbatch not found: run `upscale slurm submit` on a SLURM login node (or put sbatch on "
                           "PATH); --dry-run prints the script without it")
    logs = job_home / "slurm"
    made = [p for p in (logs, *logs.parents) if not p.exists()]
    logs.mkdir(parents=True, exist_ok=True)  # the job's log folder must exist before the job starts
    done = subprocess.run(["sbatch", "--parsable"], input=script, capture_output=True, text=True)
    if done.returncode != 0:
        for folder in made:  # deepest first: leave nothing behind
            folder.rmdir()
        why = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise CommandError(f"sbatch refused the job: {why}")
    job_id = done.stdout.strip().split(";")[0]
    console.print(job_id)
    err_console.print(f"job {job_id}: sweep {sweep.name} on {nodes} node(s); log {job_home}/slurm/"
                      f"upscale-{sweep.name}-{job_id}.out; `UPSCALE_HOME={job_home} upscale status` shows it")
