"""A throw-away SLURM cluster of one node on this machine: munged, slurmctld and slurmd from Debian's slurm-wlm and
munge, each with its own socket, ports, state and logs in a temp folder, so that it shares nothing with another
SLURM (or another test's) on the host. The real-SLURM tests (tests/deploy/test_slurm.py) submit to it with sbatch.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
START_TIMEOUT_S = 60


class SlurmUnavailable(RuntimeError):
    """SLURM cannot run here; the message says why (the tests skip with it)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# cred_expire: a requeued job waits this long (default 120 s) before it may start again.
def _conf(d: Path, cluster: str, node: str, cpus: int) -> str:
    return f"""\
ClusterName={cluster}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.socket,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _binary(name: str) -> str:
    """Where ``name`` is: on PATH, or in /usr/sbin (the daemons, off a non-root PATH)."""
    return shutil.which(name) or f"/usr/sbin/{name}"


def _logs(d: Path) -> str:
    return " | ".join(f"{p.name}: {' / '.join(p.read_text(errors='replace').splitlines()[-3:])}"
                      for p in sorted(d.glob("*.log")))


@contextlib.contextmanager
def local_slurm(d: Path) -> Iterator[dict[str, str]]:
    """Start the three daemons with their state under ``d``; yield the environment that points sbatch, squeue and
    scontrol at them (SLURM_CONF). Stops them, by their pids, on exit. Raises SlurmUnavailable when a binary is
    missing or a daemon does not come up."""
    missing = [b for b in BINARIES if not Path(_binary(b)).exists()]
    if missing:
        raise SlurmUnavailable(f"{', '.join(missing)} not installed (Debian: apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        raise SlurmUnavailable("slurmd must run as root to start jobs as their user")
    d.chmod(0o755)  # munged wants its socket's folder searchable by every user
    for sub in ("state", "spool"):
        (d / sub).mkdir(parents=True)
    node = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    cluster = f"upscale{uuid.uuid4().hex[:8]}"  # its own name: the jobs' Ray folders are named by cluster and job id
    conf.write_text(_conf(d, cluster, node, os.cpu_count() or 1))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen] = []
    try:
        subprocess.run([_binary("mungekey"), "--create", f"--keyfile={d}/munge.key"], check=True, capture_output=True)
        procs.append(subprocess.Popen(
            [_binary("munged"), "--foreground", f"--socket={d}/munge.socket", f"--key-file={d}/munge.key",
             f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        _wait(lambda: (d / "munge.socket").exists(), procs, "munged", d)
        procs.append(subprocess.Popen([_binary("slurmctld"), "-D", "-i", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        _wait(lambda: subprocess.run(["scontrol", "ping"], env=env, capture_output=True).returncode == 0, procs,
              "slurmctld", d)
        procs.append(subprocess.Popen([_binary("slurmd"), "-D", "-N", node, "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        _wait(lambda: "idle" in subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                               text=True).stdout, procs, "slurmd", d)
        _probe(env, d)
        yield env
    except (OSError, subprocess.CalledProcessError) as e:
        raise SlurmUnavailable(f"SLURM could not start: {e}") from None
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for ray_dir in Path(tempfile.gettempdir()).glob(f"upscale-ray-{cluster}-*"):  # the jobs' Ray logs
            shutil.rmtree(ray_dir, ignore_errors=True)


def _probe(env: dict[str, str], d: Path) -> None:
    """Run a job that does nothing: daemons that are up yet cannot start a job (a container that forbids what
    slurmstepd does) make the tests skip, not fail."""
    job = subprocess.run(["sbatch", "--parsable", f"--output={d}/probe.out", "--wrap=true"], env=env,
                         capture_output=True, text=True)
    if job.returncode != 0:
        raise SlurmUnavailable(f"sbatch refused a probe job: {job.stderr.strip()}")
    job_id = job.stdout.strip()
    deadline = time.monotonic() + START_TIMEOUT_S
    while "JobState=COMPLETED" not in (state := subprocess.run(["scontrol", "show", "job", job_id], env=env,
                                                                capture_output=True, text=True).stdout):
        if time.monotonic() > deadline or re.search(r"JobState=(FAILED|CANCELLED|NODE_FAIL)", state):
            raise SlurmUnavailable(f"a probe job did not run: {state.split()[:8]} {_logs(d)}")
        time.sleep(0.5)


def _wait(ready, procs: list[subprocess.Popen], name: str, d: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if procs[-1].poll() is not None or time.monotonic() > deadline:
            raise SlurmUnavailable(f"{name} did not start: {_logs(d)}")
        time.sleep(0.5)
