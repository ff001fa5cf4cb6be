"""The scheduler loop: turn a sweep's ready segments into Ray tasks and record every outcome in the store.

Ray does placement (resources per task, reused worker processes); this loop only decides *readiness and state*:
a segment is launched when all its parents are done and a claim on it succeeds, at most `max_concurrent` at a
time. A failed attempt goes back to pending and is retried, resuming from the segment's own last checkpoint (the
worker finds it in `runtime.checkpoint_dir`), until `max_attempts` failures. Cancellation is a sweep status the
loop polls. On start, segments left `running` by a scheduler that has died are *adopted* (their worker left a
result file: recorded as done, not retrained) or re-queued (resumed from their checkpoint), so no segment is
trained to completion twice. A segment another live scheduler runs is waited for, never launched twice.

The scheduler driving a sweep records itself as the sweep's `runner` and refreshes its heartbeat with its segments',
so a sweep loop that starts later can tell a sweep whose runner died (`runner_gone`) and adopt it: resume it with
`Scheduler.run`, or, if it was cancelling, end it with `Scheduler.finish_cancelling`. Ray itself never retries a
segment (orchestrator/task.py): the store's attempts are the only retries.

Failures are sorted by whose they are (orchestrator/infra.py): a bad value is one failed attempt, never retried; a
crash is retried within the attempts; Ray dying, a full disk or a failing store count against nothing: the run stops
with `InfrastructureError`, its running workers are left to finish (a worker killed after its last step would have
its segment trained again) and the sweep goes back to `pending` to resume once the infrastructure is back (the sweep
loop restarts Ray). A scheduler that stops for any reason is *retired*: its process lives on, yet the segments and
sweep it left `running` count as orphaned (`owner_alive`), so the next scheduler adopts or re-queues them instead of
waiting for ever. MLflow is the dashboard, never a dependency: every tracking call is best effort
(`BestEffortTracker`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import socket
import stat
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import ray
import ray.util.client
from ray.core.generated.gcs_pb2 import GcsNodeInfo
from ray.core.generated.ray_client_pb2 import ClusterInfoType

from upscale import storage
from upscale.orchestrator import verbosity
from upscale.orchestrator.attempt_files import pid_alive, read_result, worker_running
from upscale.orchestrator.clock import as_utc, utcnow
from upscale.orchestrator.errors import OrchestratorError
from upscale.orchestrator.infra import (
    ClusterUnavailable,
    InfrastructureError,
    is_deterministic,
    is_infrastructure,
    node_lost,
)
from upscale.orchestrator.lr_search import resolve_lr, run_lr_search
from upscale.orchestrator.observations import table
from upscale.orchestrator.records import AttemptRecord, SegmentRecord, SweepRecord
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.store import Store, checkpoint_at
from upscale.orchestrator.task import SegmentFn, segment_task, train_segment
from upscale.orchestrator.tracking import BestEffortTracker, RunTree, SegmentRun
from upscale.orchestrator.training_path import training_path
from upscale.sweeps.resources import ClusterResources
from upscale.sweeps.segments import BUILD_KINDS, DECAY_KINDS, TRUNK_KINDS, SegmentResult, SegmentRuntime, SegmentSpec
from upscale.sweeps.spec import ResourcesSection, SizeOverride, TrainSection
from upscale.sweeps.steps import round_steps


@dataclass
class Progress:
    """What the loop knows after each event; the CLI renders it."""

    total: int
    done: int = 0
    running: int = 0
    failed: int = 0
    trained: int = 0
    message: str = ""
    done_keys: frozenset[str] = frozenset()  # the segments done, for the CLI's tokens and time left


@dataclass
class SweepOutcome:
    """How a run of the scheduler over one sweep ended."""

    sweep_id: str
    status: str
    trained: list[str] = field(default_factory=list)  # segments this run trained to completion
    adopted: list[str] = field(default_factory=list)  # finished by a dead scheduler's worker, recorded here
    retried: int = 0  # failed attempts that were retried
    wall_s: float = 0.0
    compute_s: float = 0.0  # sum of the segments' own wall times, as the workers measured them


STALE_AFTER_S = 120.0  # a scheduler on another host whose heartbeat is older than this is taken for dead
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Ray's driver exits the whole process (C++ QuickExit) once its GCS has been unreachable this long, 60 s by default:
# a `ray stop` anywhere on the host would end `upscale serve`. A year instead: the sweep loop notices the dead GCS
# (`ray_problem`) and restarts Ray itself.
GCS_RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
GCS_RECONNECT_S = 365 * 24 * 3600
RAY_VITAL = ("raylet", "gcs_server")  # embedded Ray's processes without which no task runs
NODE_PROBE_S = 5.0  # how long a RAY_ADDRESS cluster's GCS may take to list its nodes before it counts as down
_RAY_LOCK = threading.RLock()  # one thread starts, restarts or probes Ray at a time (the loops and request threads)
_RESTARTING = threading.Event()  # `restart_ray` is under way: Ray is down even while `ray.is_initialized()` says not
_RETIRED: set[str] = set()  # owners of the schedulers of this process that have stopped (`owner_alive`)
# segment key -> the Ray task a stopped scheduler of this process left running (`Scheduler._abandon`): the next
# scheduler waits for it wherever it runs, as it waits for a live worker's pid on this host.
_LEFT_RUNNING: dict[str, ray.ObjectRef] = {}


def ensure_ray(settings: Settings, num_cpus: int | None = None) -> None:
    """Connect to RAY_ADDRESS, or start embedded local Ray bound to the loopback interface, once per process.

    Unless verbose (`upscale -v`), Ray's banners are off and workers' output stays in Ray's session logs
    (log_to_driver=False): the CLI's stdout carries only its results (`upscale run --json`), and a failure reaches
    the store through the task's exception. The driver outlives a lost GCS (GCS_RECONNECT_ENV)."""
    with _RAY_LOCK:
        if ray.is_initialized():
            return
        os.environ.setdefault(GCS_RECONNECT_ENV, str(GCS_RECONNECT_S))
        local = settings.ray_address is None
        if local:
            _loopback_only()
        # "local" always starts a fresh embedded instance; address=None would join any Ray started on this host.
        ray.init(address=settings.ray_address or "local", num_cpus=num_cpus if local else None,
                 include_dashboard=False, logging_level=verbosity.ray_logging_level(),
                 log_to_driver=verbosity.is_verbose(),
                 **({"_node_ip_address": "127.0.0.1", "_temp_dir": private_ray_dir()} if local else {}))


def private_ray_dir() -> str:
    """The folder embedded Ray keeps its sessions in (sockets, logs, spilled objects), which only this user may
    enter: Ray makes that folder and each session's 0777 whatever the umask (so that users can share /tmp/ray), so
    it is <temp>/upscale-ray-<uid>/ray, inside a folder of ours that stays 0700. A folder of that name that is a
    symlink or another user's is refused: it could hand this user's sessions to someone else."""
    path = os.path.join(tempfile.gettempdir(), f"upscale-ray-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise OrchestratorError(f"{path} is not a folder of this user's (a symlink, or another user's): remove it; "
                                  f"embedded Ray keeps its sessions there, private to the user who runs it")
    os.chmod(path, 0o700)
    return os.path.join(path, "ray")


def ray_problem(settings: Settings, wait: bool = True) -> str | None:
    """What keeps Ray from running segments now, in one line, or None while it can. Never blocks on a dead GCS (a
    call to it would hang): embedded Ray's vital processes are looked at directly, a RAY_ADDRESS cluster's GCS is
    asked for its nodes with a timeout. Unless ``wait``, a Ray being started or restarted by another thread is
    reported as such at once."""
    if not _RAY_LOCK.acquire(blocking=wait):
        return "Ray is being started or restarted"
    try:
        if not ray.is_initialized():
            return "Ray is not running"
        if settings.ray_address is None:
            node = ray._private.worker._global_node  # None: this process joined a Ray it did not start
            dead = sorted({kind for kind, _ in node.dead_processes() if kind in RAY_VITAL}) if node else []
            return f"embedded Ray's {' and '.join(dead)} died" if dead else None
        try:
            alive = _live_nodes()
        except Exception as e:  # whatever the GCS or the client server raises, the cluster is unreachable
            return f"the Ray cluster (RAY_ADDRESS) does not answer: {type(e).__name__}"
        if not alive:
            return "the Ray cluster (RAY_ADDRESS) has no live node"
        return None
    finally:
        _RAY_LOCK.release()


def _live_nodes() -> int:
    """How many nodes of the RAY_ADDRESS cluster are alive, asked with a deadline (NODE_PROBE_S): through the head's
    Ray Client server when this process drives the cluster as a client (ray://, as the deployed API does: it has no
    GCS connection of its own), else from the GCS."""
    if ray.util.client.ray.is_connected():
        nodes = ray.util.client.ray.worker.get_cluster_info(ClusterInfoType.NODES, timeout=NODE_PROBE_S)
        return sum(bool(n.get("Alive")) for n in nodes)
    nodes = ray._private.worker.global_worker.gcs_client.get_all_node_info(timeout=NODE_PROBE_S)
    return sum(info.state == GcsNodeInfo.ALIVE for info in nodes.values())


def restart_ray(settings: Settings) -> None:
    """Shut down a Ray that died and start embedded Ray again, or connect to RAY_ADDRESS anew."""
    _RESTARTING.set()
    try:
        with _RAY_LOCK:
            ray.shutdown()
            _LEFT_RUNNING.clear()  # their tasks died with the old Ray
            ensure_ray(settings)
    finally:
        _RESTARTING.clear()


def ray_restarting() -> bool:
    """Whether this process is restarting Ray now (it has no cluster until that ends)."""
    return _RESTARTING.is_set()


def _loopback_only() -> None:
    """Make embedded Ray listen on 127.0.0.1 only: its ports have no authentication of their own.

    Every Ray server (GCS, raylet, object manager, dashboard and runtime-env agents, each worker's and the driver's
    gRPC server) binds to the node IP, or to all interfaces unless that IP is a loopback one; and on Linux Ray turns
    a loopback `_node_ip_address` into the host's routable address. Ray's single-host mode (its default on macOS
    and Windows) keeps the loopback address: switch it on here (Ray reads the constant at each call) and for the
    processes Ray starts (they read the variable at import). A RAY_ADDRESS cluster is the operator's: untouched."""
    from ray._private import ray_constants

    os.environ[LOOPBACK_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def step_options(spec: dict, size: str | None) -> dict:
    """How a segment of size ``size`` of the stored sweep ``spec`` computes a step and what it measures (not its
    results): the spec's micro-batch for the size (None: the worker fits one to its device), activation
    checkpointing, and the validation cadence in whole steps of the size (rounded as the spec's budgets are)."""
    train = TrainSection.model_validate(spec["train"])
    override = SizeOverride.model_validate(spec.get("per_size", {}).get(size, {}))
    tps = (override.batch_size or train.batch_size) * train.context
    every = None if train.eval_every_tokens is None else round_steps(train.eval_every_tokens, tps) * tps
    return {"micro_batch_size": override.micro_batch_size or train.micro_batch_size,
            "activation_checkpointing": train.activation_checkpointing, "eval_every_tokens": every}


def cluster_resources(settings: Settings) -> ClusterResources:
    """The CPUs and GPUs of the cluster sweeps run on (embedded Ray, started if need be, or RAY_ADDRESS's);
    ClusterUnavailable while Ray is down, rather than the zero CPUs a dead node leaves."""
    problem = "Ray is being restarted" if ray_restarting() else None
    if problem is None:
        ensure_ray(settings)
        problem = ray_problem(settings)
    if problem is not None:
        raise ClusterUnavailable(f"the cluster is unavailable ({problem}); it is being restarted: try again shortly")
    have = ray.cluster_resources()
    return ClusterResources(cpus=have.get("CPU", 0), gpus=have.get("GPU", 0))


def owner_id() -> str:
    """host:pid:nonce of this scheduler; the nonce tells a restarted process with a reused pid apart."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def owner_alive(owner: str | None, heartbeat_at: datetime | None, stale_after_s: float) -> bool:
    """Whether the scheduler ``owner`` (host:pid:nonce) still runs: its pid on this host (unless it is one of this
    process's retired schedulers), its heartbeat ``heartbeat_at`` elsewhere. Segments and sweeps both record the
    scheduler that runs them this way."""
    host, pid, _ = (owner or "::").split(":")
    if host == socket.gethostname():
        return pid_alive(int(pid)) and owner not in _RETIRED
    return heartbeat_at is not None and _age_s(heartbeat_at) < stale_after_s


def runner_gone(sweep: SweepRecord, stale_after_s: float = STALE_AFTER_S) -> bool:
    """Whether nobody drives ``sweep`` any more: its runner died, or (a sweep recorded before runners were) it has
    none and has not changed for ``stale_after_s``."""
    if sweep.runner is None:
        return _age_s(sweep.updated_at) >= stale_after_s
    return not owner_alive(sweep.runner, sweep.runner_heartbeat_at, stale_after_s)


def _age_s(when: datetime) -> float:
    return (utcnow() - as_utc(when)).total_seconds()


class Scheduler:
    """Runs sweeps from the store to completion on Ray; `segment_fn` is the training function (a seam for tests)."""

    def __init__(self, store: Store, settings: Settings, segment_fn: SegmentFn = train_segment,
                 max_concurrent: int | None = None, max_attempts: int = 3, poll_s: float = 0.5,
                 stale_after_s: float = STALE_AFTER_S, heartbeat_s: float = 10.0,
                 checkpoint_every_tokens: int | None = None, tracker: RunTree | None = None,
                 on_progress: Callable[[Progress], None] | None = None,
                 data_roots: Sequence[Path] | None = None) -> None:
        self.store, self.settings, self.segment_fn = store, settings, segment_fn
        self.data_roots = None if data_roots is None else tuple(str(r) for r in data_roots)  # to each SegmentRuntime
        self.max_concurrent, self.max_attempts = max_concurrent, max_attempts
        self.poll_s, self.stale_after_s, self.heartbeat_s = poll_s, stale_after_s, heartbeat_s
        self.checkpoint_every_tokens = checkpoint_every_tokens
        self.tracker = BestEffortTracker(settings, tracker)
        self.on_progress = on_progress
        self.owner = owner_id()
        self.interrupted = threading.Event()  # `interrupt`: the process stops; the sweep resumes on its next start

    def interrupt(self) -> None:
        """Stop soon without cancelling: running segments are released and the sweep goes back to pending."""
        self.interrupted.set()

    def retire(self) -> None:
        """This scheduler drives nothing any more: what it left `running` is orphaned for the next one to adopt."""
        _RETIRED.add(self.owner)

    def run(self, sweep_id: str) -> SweepOutcome:
        """Train every segment of the sweep that is not done yet; returns when all are done, one has failed for
        good, the sweep is cancelled or interrupted. InfrastructureError (the sweep back to pending) when Ray, the
        disk or the store failed under it."""
        try:
            ensure_ray(self.settings)
            self.store.set_sweep(sweep_id, runner=self.owner, runner_heartbeat_at=utcnow())
            return self._run(sweep_id)
        finally:
            self.retire()
            self.store.release_sweep(sweep_id, self.owner)

    def _run(self, sweep_id: str) -> SweepOutcome:
        t0 = time.perf_counter()
        sweep = self.store.sweep(sweep_id)
        self.store.reset_failed([s.key for s, _ in self.store.members(sweep_id)])  # each run: a fresh retry budget
        if not self.tracker.exists(sweep.mlflow_run_id):  # none yet, or lost with the tracking store
            sweep.mlflow_run_id = self.tracker.start_sweep(sweep.id, sweep.name, sweep.spec) or sweep.mlflow_run_id
            self.store.set_sweep(sweep_id, mlflow_run_id=sweep.mlflow_run_id)
        self.store.start_sweep(sweep_id)  # unless cancelling: then the loop's first poll stops it
        if sweep.reuse_stale and sweep.mlflow_run_id:
            self.tracker.tag_reused_stale(sweep.mlflow_run_id, len(sweep.stale_segments or {}))
        self._show_reused(sweep)
        out = SweepOutcome(sweep_id, "running")
        inflight: dict[ray.ObjectRef, tuple[str, AttemptRecord]] = {}
        try:
            self._loop(sweep, out, inflight)
        except KeyboardInterrupt:  # Ctrl-C of `upscale run`: stop the workers and leave every segment resumable
            self._cancel(inflight)
            self.store.set_sweep(sweep_id, status="cancelled", error="interrupted; run it again to resume")
            raise
        except BaseException as e:  # the infrastructure failed, the process stops, or a bug: leave it resumable
            self._abandon(inflight)
            infrastructure = is_infrastructure(e)
            self.store.set_sweep(sweep_id, status="pending", error=(
                f"paused: {_one_line(e)}; it resumes by itself when this is mended" if infrastructure
                else f"interrupted: {_one_line(e)}; run it again to resume"))
            if infrastructure and not isinstance(e, InfrastructureError):
                raise InfrastructureError(_one_line(e)) from e
            raise
        if out.status == "interrupted":  # the server stops: the next start resumes it, its MLflow run still open
            self.store.set_sweep(sweep_id, status="pending", error="the server stopped; it resumes on its next start")
            return out
        out.wall_s = time.perf_counter() - t0
        segs = {s.key: s for s, _ in self.store.members(sweep_id)}
        failed = [s for s in segs.values() if s.status == "failed"]
        self._show_reused(sweep)  # segments another sweep finished while this one waited for them
        mlflow_status = {"done": "FINISHED", "cancelled": "KILLED"}.get(out.status, "FAILED")
        done = sum(s.status == "done" for s in segs.values())
        if sweep.mlflow_run_id:
            self.tracker.log_metrics(sweep.mlflow_run_id, self.store.hooks.sweep_metrics(self.store, sweep_id), done)
            self.tracker.end_sweep(sweep.mlflow_run_id, mlflow_status,
                                   {"wall_s": out.wall_s, "compute_s": out.compute_s,
                                    "segments_trained": len(out.trained)},
                                   table(self.store.observations(sweep_id)), segments_done=done)
        # the status last: whoever sees the sweep ended finds its MLflow run ended too
        self.store.set_sweep(sweep_id, status=out.status, error=failure(failed) if failed else None)
        self._progress(segs, out)
        return out

    def finish_cancelling(self, sweep_id: str) -> SweepOutcome:
        """End a sweep that was cancelling when its runner died: the segments that runner left running are adopted
        (their worker finished) or released back to pending with their MLflow runs ended KILLED, then the sweep is
        `cancelled` and its MLflow run KILLED. The caller has claimed the sweep (`Store.claim_sweep`)."""
        t0 = time.perf_counter()
        sweep = self.store.sweep(sweep_id)
        out = SweepOutcome(sweep_id, "cancelled")
        segs = {s.key: s for s, _ in self.store.members(sweep_id)}
        for key in self._recover(segs, out):
            if segs[key].mlflow_run_id:
                self.tracker.end_segment(segs[key].mlflow_run_id, "KILLED")
        out.wall_s = time.perf_counter() - t0
        if sweep.mlflow_run_id:
            self.tracker.end_sweep(sweep.mlflow_run_id, "KILLED",
                                   {"wall_s": out.wall_s, "compute_s": out.compute_s, "segments_trained": 0},
                                   table(self.store.observations(sweep_id)),
                                   segments_done=sum(s.status == "done" for s in segs.values()))
        self.store.set_sweep(sweep_id, status="cancelled", error=None, runner=None)  # last, as in `_run`
        return out

    def _loop(self, sweep: SweepRecord, out: SweepOutcome,
              inflight: dict[ray.ObjectRef, tuple[str, AttemptRecord]]) -> None:
        """Launch ready segments and settle finished ones until the sweep is done, blocked or cancelled."""
        limit = self.max_concurrent or self._slots(sweep)
        last_beat = time.monotonic()
        while True:
            status, members = self.store.poll(sweep.id)  # one transaction per pass
            segs = {s.key: s for s, _ in members}
            axes = {s.key: link.axes for s, link in members}
            if status == "cancelling":
                self._cancel(inflight)
                out.status = "cancelled"
                return
            if self.interrupted.is_set():
                self._cancel(inflight)
                out.status = "interrupted"
                return
            self._recover(segs, out)
            progress = self._progress(segs, out)
            if progress.done == len(segs):
                out.status = "done"
                return
            ready = [s for s in segs.values()
                     if s.status == "pending" and all(segs[p].status == "done" for p in s.parents)]
            for seg in ready:
                if len(inflight) >= limit:
                    break
                attempt = self.store.claim(seg.key, self.owner)
                if attempt is None:
                    continue
                try:
                    inflight[self._launch(sweep, seg, segs, axes[seg.key])] = (seg.key, attempt)
                except OrchestratorError as e:  # e.g. a parent checkpoint is missing: retrying cannot help
                    self.store.fail(seg.key, attempt, str(e), 0, retry=False)
                    self._report_msg(f"FAILED {seg.kind} {seg.key}: {e}")
            if not inflight and not ready and not any(s.status == "running" for s in segs.values()):
                out.status = "failed"  # nothing runs and nothing can start: a failure blocks the rest
                return
            if inflight:
                finished, _ = ray.wait(list(inflight), num_returns=1, timeout=self.poll_s)
                for ref in finished:
                    self._settle(ref, *inflight.pop(ref), segs, out)
            else:
                time.sleep(self.poll_s)  # waiting on segments another live scheduler runs
            if time.monotonic() - last_beat > self.heartbeat_s:
                self._check_ray()
                self.store.heartbeat(self.owner)
                self.store.sweep_heartbeat(sweep.id, self.owner)
                last_beat = time.monotonic()

    def _check_ray(self) -> None:
        problem = ray_problem(self.settings)
        if problem is not None:
            raise ClusterUnavailable(problem)

    def _show_reused(self, sweep: SweepRecord) -> None:
        """Show the segments this sweep shares with sweeps that trained them under this sweep's run too."""
        members = self.store.members(sweep.id)
        segs = {s.key: s for s, _ in members}
        done = [SegmentRun(s.key, resolve_lr(SegmentSpec.model_validate(s.config), segs), link.axes, s.mlflow_run_id)
                for s, link in members if s.status == "done" and s.mlflow_run_id]
        if done and sweep.mlflow_run_id:
            self.tracker.show_reused(sweep.mlflow_run_id, sweep.id, done)

    def _slots(self, sweep: SweepRecord) -> int:
        """Default concurrency: as many segments as the cluster's CPUs (and GPUs) hold at once."""
        res = ResourcesSection.model_validate(sweep.resources)
        cpus, gpus = res.cpus * res.workers, res.gpus * res.workers
        have = ray.cluster_resources()
        slots = int(have.get("CPU", 1) // cpus)
        if gpus:
            slots = min(slots, int(have.get("GPU", 0) // gpus))
        return max(slots, 1)

    def _launch(self, sweep: SweepRecord, seg: SegmentRecord, segs: dict[str, SegmentRecord],
                axes: dict) -> ray.ObjectRef:
        spec = SegmentSpec.model_validate(seg.config)
        if spec.id != seg.key:
            raise OrchestratorError(f"segment {seg.key}: stored config hashes to {spec.id}; refusing to train it")
        resolved = resolve_lr(spec, segs)  # the LR an lr_search found: the run's params carry it from the start
        run_id = seg.mlflow_run_id
        if sweep.mlflow_run_id and not self.tracker.exists(run_id):  # none yet, or lost with the tracking store
            run_id = self.tracker.start_segment(sweep.mlflow_run_id, sweep.id, seg.key, resolved, axes)
            if run_id is not None:  # MLflow down: the segment trains without a run
                self.store.set_segment_run(seg.key, run_id)
                seg.mlflow_run_id = run_id  # _settle may see this record before the next reload
        res = ResourcesSection.model_validate(sweep.resources)
        # Upcycles, expands and imports do not train and an LR search's trials are short single-process runs: one
        # worker each.
        workers = 1 if spec.kind in BUILD_KINDS | {"dense_import", "lr_search"} else res.workers
        runtime = SegmentRuntime(
            checkpoint_dir=self.segment_dir(seg.key),
            parent_checkpoints={p: parent_checkpoint(segs[p], spec.start_tokens, self.segment_dir(p))
                                for p in spec.parent_ids},
            mlflow_tracking_uri=self.settings.mlflow_tracking_uri, mlflow_run_id=run_id,
            num_threads=max(1, math.floor(res.cpus)), workers=workers,
            device="cuda" if res.gpus else "cpu", checkpoint_every_tokens=self.checkpoint_every_tokens,
            data_cache_dir=str(self.settings.data_cache_dir), data_roots=self.data_roots,
            **step_options(sweep.spec, axes.get("size")),
        )
        self.store.hooks.before_launch(self.store, sweep.id, seg)  # e.g. the ledger's prediction, scored when done
        self._report_msg(f"start {seg.kind} {seg.key}")
        task, options = segment_task(workers, res.cpus, res.gpus)
        fn = self.segment_fn
        if spec.kind == "lr_search":
            fn = functools.partial(run_lr_search, storage=self.store.url, train=self.segment_fn)
        return task.options(**options).remote(fn, resolved, runtime, seg.key)

    def segment_dir(self, key: str) -> str:
        return storage.join(self.settings.checkpoint_dir, key)  # a path, or a URI ('/'-joined)

    def _settle(self, ref: ray.ObjectRef, key: str, attempt: AttemptRecord, segs: dict[str, SegmentRecord],
                out: SweepOutcome) -> None:
        """Record one finished Ray task: done, retried or failed for good."""
        seg = segs[key]
        try:
            result = SegmentResult.model_validate(ray.get(ref))
        except Exception as e:  # the worker's exception, re-raised by ray.get as a RayTaskError
            error = _one_line(e)
            problem = ray_problem(self.settings)
            # One node of a cluster died and the others answer: they take the segment (embedded Ray's one node
            # dying is Ray down).
            if problem is None and self.settings.ray_address and node_lost(e):
                self.store.release(key, attempt, "node lost")
                self._report_msg(f"requeued {seg.kind} {key}: its Ray node died ({error})")
                return
            if is_infrastructure(e) or problem is not None:  # not the segment's fault
                self.store.release(key, attempt, "infrastructure")
                self._report_msg(f"paused {seg.kind} {key}: {error}")
                raise InfrastructureError(error) from e
            # A bad value (spec, checkpoint, NaN loss, a location nothing can open): the same attempt would fail the
            # same way.
            status = self.store.fail(key, attempt, error, self.max_attempts, retry=not is_deterministic(e))
            if status == "pending":
                out.retried += 1
            elif seg.mlflow_run_id:
                self.tracker.end_segment(seg.mlflow_run_id, "FAILED")
            self._report_msg(f"{'retry' if status == 'pending' else 'FAILED'} {seg.kind} {key}: {error}")
            return
        if result.val_loss is not None and not math.isfinite(result.val_loss):
            self.store.fail(key, attempt, f"validation loss is {result.val_loss}: lower the LR", 0, retry=False)
            if seg.mlflow_run_id:
                self.tracker.end_segment(seg.mlflow_run_id, "FAILED")
            return
        if self.store.complete(key, attempt, result):
            out.trained.append(key)
            out.compute_s += result.wall_s
            self._end_finished(seg, result)
            self._report_msg(f"done {seg.kind} {key}" + (f" loss {result.val_loss:.4f}" if result.val_loss else ""))

    def _recover(self, segs: dict[str, SegmentRecord], out: SweepOutcome) -> list[str]:
        """Adopt or re-queue segments whose scheduler died while they ran; returns the keys re-queued."""
        requeued = []
        for seg in list(segs.values()):
            if seg.status != "running" or seg.owner == self.owner:
                continue
            if owner_alive(seg.owner, seg.heartbeat_at, self.stale_after_s):
                continue
            attempt = self.store.open_attempt(seg.key)
            if attempt is None or attempt.owner != seg.owner:
                continue
            directory = self.segment_dir(seg.key)
            result = read_result(directory, seg.key)
            if result is not None and self.store.complete(seg.key, attempt, result, adopted=True):
                _LEFT_RUNNING.pop(seg.key, None)
                out.adopted.append(seg.key)
                out.compute_s += result.wall_s
                self._end_finished(seg, result)
                self._report_msg(f"adopted {seg.kind} {seg.key}")
            elif result is None and (worker_running(directory) or task_left_running(seg.key)):
                continue  # its worker outlived the scheduler: adopt the result when it lands
            elif result is None:
                self.store.release(seg.key, attempt, "orphaned")
                requeued.append(seg.key)
                self._report_msg(f"re-queued {seg.kind} {seg.key} (its scheduler died)")
            segs[seg.key] = self.store.segment(seg.key)
        return requeued

    def _cancel(self, inflight: dict[ray.ObjectRef, tuple[str, AttemptRecord]]) -> None:
        """Stop the running segments: each goes back to pending, or is recorded done if its worker finished first
        (its result file landed), so nothing finished is trained again."""
        self._stop_tasks(inflight)
        for key, attempt in list(inflight.values()):
            result = read_result(self.segment_dir(key), key)
            if result is None or not self.store.complete(key, attempt, result, adopted=True):
                self.store.release(key, attempt, "cancelled")
                continue
            self._end_finished(self.store.segment(key), result)
        inflight.clear()

    def _end_finished(self, seg: SegmentRecord, result: SegmentResult) -> None:
        """End a segment's MLflow run FINISHED with its summary, once the store records it done; a decay's run
        first gets its whole training path (`RunTree.log_path`)."""
        if seg.mlflow_run_id and seg.kind in DECAY_KINDS:
            self.tracker.log_path(seg.mlflow_run_id, training_path(seg.key, self.store.segment))
        if seg.mlflow_run_id:
            self.tracker.end_segment(seg.mlflow_run_id, "FINISHED", _summary(result), seg.config["end_tokens"])

    def _abandon(self, inflight: dict[ray.ObjectRef, tuple[str, AttemptRecord]]) -> None:
        """Leave the running segments running after a failure of the store, of Ray or of this loop: killed between
        its last step and its result file, a worker's segment would be trained again. Each stays `running` under
        this (retired) scheduler; the next one adopts its result once the task ends, or re-queues it if the task
        died with Ray (`_recover`)."""
        if inflight:
            _LEFT_RUNNING.update({key: ref for ref, (key, _) in inflight.items()})
            self._report_msg(f"left {len(inflight)} segment(s) running for the next run to adopt")
        inflight.clear()

    @staticmethod
    def _stop_tasks(inflight: dict[ray.ObjectRef, tuple[str, AttemptRecord]]) -> None:
        for ref in inflight:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # Ray is down: its tasks died with it
                continue

    def _progress(self, segs: dict[str, SegmentRecord], out: SweepOutcome) -> Progress:
        statuses = [s.status for s in segs.values()]
        p = Progress(total=len(segs), done=statuses.count("done"), running=statuses.count("running"),
                     failed=statuses.count("failed"), trained=len(out.trained),
                     done_keys=frozenset(k for k, s in segs.items() if s.status == "done"))
        self._report(p)
        return p

    def _report(self, progress: Progress) -> None:
        if self.on_progress is not None:
            self.on_progress(progress)

    def _report_msg(self, message: str) -> None:
        if self.on_progress is not None:
            self.on_progress(Progress(total=0, message=message))


def task_left_running(key: str) -> bool:
    """Whether the task a stopped scheduler of this process left running on segment ``key`` still runs (a Ray that
    cannot answer has lost it)."""
    ref = _LEFT_RUNNING.get(key)
    if ref is None:
        return False
    try:
        ready, _ = ray.wait([ref], timeout=0)
    except Exception:  # Ray is down: the task died with it
        ready = [ref]
    if ready:
        del _LEFT_RUNNING[key]
    return not ready


def parent_checkpoint(parent: SegmentRecord, start_tokens: int, parent_dir: str) -> str:
    """Where a child starting at ``start_tokens`` begins from: a trunk's checkpoint at that branch point (a piece's
    end, or a branch point it saved: `checkpoint_at`), an lr_search's directory (its result.json
    holds best_lr), otherwise the parent's final checkpoint."""
    result = parent.result or {}
    if parent.kind == "lr_search":
        return result.get("checkpoint") or parent_dir
    if parent.kind in TRUNK_KINDS:
        found = checkpoint_at(parent, start_tokens)
        if found is None:
            saved = sorted(int(k) for k in (result.get("branch_checkpoints") or {}))
            raise OrchestratorError(f"trunk {parent.key} has no checkpoint at {start_tokens} tokens "
                                    f"(it saved {saved} and its end, {parent.config['end_tokens']})")
        return found
    if not result.get("checkpoint"):
        raise OrchestratorError(f"segment {parent.key} finished without a checkpoint")
    return result["checkpoint"]


def _summary(result: SegmentResult) -> dict[str, float]:
    values = {"wall_s": result.wall_s, "tokens_per_s": result.tokens_per_s, **result.metrics}
    if result.val_loss is not None:
        values["val_loss"] = result.val_loss
    if result.best_lr is not None:
        values["best_lr"] = result.best_lr
    return values


def failure(failed: Sequence[SegmentRecord]) -> str:
    """A failed sweep's error, its cause first: the first failed segment's own error, then which segments failed."""
    first = failed[0]
    keys = ", ".join(s.key for s in failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
    return f"{first.error or 'a segment failed'} (segment {first.key}; {len(failed)} segment(s) failed: {keys})"


def _one_line(e: BaseException) -> str:
    """The root cause of a worker failure in one line (RayTaskError wraps the worker's exception)."""
    cause = getattr(e, "cause", None) or e
    lines = traceback.format_exception_only(type(cause), cause)
    return lines[-1].strip()[:500]
