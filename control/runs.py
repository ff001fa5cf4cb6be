"""Running a sweep in this process: the one road `upscale run`, `upscale demo`, an in-process `upscale submit --wait`,
the server's sweep loop (control/sweep_loop.py) and the bench scripts take to train a sweep.

`run_spec` plans the spec once and passes that plan on: to the identical-sweep lookup, to the comparison with the
store (stale segments, other cuts of a chain), to the record it submits, to the token cache it prepares and to the
estimates the progress bar shows. `run_recorded` drives a sweep already recorded (an in-process `submit --wait`),
estimated from its stored segments, so nothing is planned again. Both make sure Ray is up, build the token cache
before the first segment needs it, and drive the one `Scheduler` this module builds (`scheduler`, which the sweep
loop uses too). What happens meanwhile is told to a `RunWatch`: api/cli/progress.py's bar on a terminal, `QUIET`
elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol

import ray

from upscale.control.plans import stale_lines
from upscale.control.services import LOCAL_OWNER, Services
from upscale.control.sweeps import identical
from upscale.control.timing import stored_seconds
from upscale.orchestrator.records import SegmentRecord
from upscale.orchestrator.scheduler import Progress, Scheduler, SweepOutcome, ensure_ray
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.task import SegmentFn, train_segment
from upscale.sweeps.planner import Plan, gpu_flops_per_s, plan, segment_seconds
from upscale.sweeps.segments import DataSpec, SegmentSpec
from upscale.sweeps.spec import SweepSpec
from upscale.workers.distributed import pending_op_build

# Rough wall time of DeepSpeed's one-time op build on a 2-core machine (compiler-bound).
OP_BUILD_NOTE = "1-3 min"


@dataclass(frozen=True)
class Estimates:
    """Per segment key, what the plan estimates: its seconds and its tokens (a bar's tokens and time left)."""

    seconds: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)


class RunWatch(Protocol):
    """Whoever watches a run: told what it does while it does it (api/cli/progress.py `BarWatch` renders it)."""

    def note(self, text: str) -> None:
        """A line worth reading: an identical sweep resumed, stale segments, a one-time build ahead."""

    def starting_ray(self, what: str) -> AbstractContextManager[object]:
        """Around the start of Ray (tens of seconds, silent otherwise)."""

    def tokenising(self, what: str) -> AbstractContextManager[Callable[[int, int], None]]:
        """Around the token cache's preparation; yields its (done, total) callback, called only if it is built."""

    def sweep(self, label: str, estimates: Estimates) -> AbstractContextManager[Callable[[Progress], None]]:
        """Around the scheduler's run; yields its `on_progress` callback."""


class _Quiet:
    """Tells nobody: the bench scripts."""

    def note(self, text: str) -> None:
        return None

    def starting_ray(self, what: str) -> AbstractContextManager[object]:
        return nullcontext()

    @contextmanager
    def tokenising(self, what: str) -> Iterator[Callable[[int, int], None]]:
        yield lambda done, total: None

    @contextmanager
    def sweep(self, label: str, estimates: Estimates) -> Iterator[Callable[[Progress], None]]:
        yield lambda progress: None


QUIET: RunWatch = _Quiet()


class Ran(NamedTuple):
    """How `run_spec` ended, and the plan it made of the spec."""

    outcome: SweepOutcome
    plan: Plan


def scheduler(services: Services, on_progress: Callable[[Progress], None] | None = None, *,
              segment_fn: SegmentFn = train_segment, max_concurrent: int | None = None, max_attempts: int = 3,
              poll_s: float = 0.5, data_roots: Sequence[Path] | None = None) -> Scheduler:
    """The scheduler that trains a sweep of ``services``'s store: every road here, and the sweep loop, build it here.
    ``data_roots``: where a server confines a sweep's files (None: anywhere, the operator's own machine)."""
    return Scheduler(services.store, services.settings, segment_fn, max_concurrent=max_concurrent,
                     max_attempts=max_attempts, poll_s=poll_s, on_progress=on_progress, data_roots=data_roots)


def run_spec(services: Services, spec: SweepSpec, watch: RunWatch = QUIET, *, new: bool = False,
             reuse_stale: bool = False, segment_fn: SegmentFn = train_segment, max_concurrent: int | None = None,
             max_attempts: int = 3) -> Ran:
    """Train ``spec`` to completion here, planning it once. Unless ``new``, the local sweep of an identical spec is
    resumed (or, when done, returned without starting Ray). Segments the store holds only under an older
    training-semantics version are retrained, or with ``reuse_stale`` taken over (said to ``watch`` either way);
    segments held under another cut of their chain are taken over always."""
    p = plan(spec)
    existing = None if new else identical(services, spec, p, LOCAL_OWNER)
    if existing is not None:
        watch.note(f"sweep {existing.id} already has this identical spec ({existing.status}): "
                   f"{'returning' if existing.status == 'done' else 'resuming'} it; --new records another")
        if existing.status == "done":  # nothing to train: no Ray, no scheduler
            return Ran(SweepOutcome(existing.id, "done"), p)
    compared = services.orch.compare(p, reuse_stale)
    for line in stale_lines(compared.stale, compared.reuse_stale):
        watch.note(line)
    start_ray(services.settings, watch)
    if p.segments and not spec.resources.gpus:
        first = p.segments[0].spec
        prepare_data(services.settings, watch, first.data, first.model.context)
    sweep_id = services.orch.sweep_to_run(spec, compared, existing.id if existing else None)
    estimates = Estimates(segment_seconds(p, flops_per_s=gpu_flops_per_s(spec)),
                          {s.id: s.tokens for s in p.segments})
    with watch.sweep(f"sweep {spec.name}", estimates) as on_progress:
        out = scheduler(services, on_progress, segment_fn=segment_fn, max_concurrent=max_concurrent,
                        max_attempts=max_attempts).run(sweep_id)
    return Ran(out, p)


def run_recorded(services: Services, sweep_id: str, watch: RunWatch = QUIET, *,
                 segment_fn: SegmentFn = train_segment) -> SweepOutcome:
    """Train the recorded sweep ``sweep_id`` to completion here (what an in-process `submit --wait` does: nobody
    else trains it), estimated from its stored segments rather than by planning its spec again."""
    sweep = services.store.sweep(sweep_id)
    segments = [seg for seg, _ in services.store.members(sweep_id)]
    start_ray(services.settings, watch)
    if segments and not sweep.resources.get("gpus"):
        first = SegmentSpec.model_validate(segments[0].config)
        prepare_data(services.settings, watch, first.data, first.model.context)
    flops_per_s = gpu_flops_per_s(SweepSpec.model_validate(sweep.spec))
    with watch.sweep(f"sweep {sweep_id}", stored_estimates(segments, flops_per_s)) as on_progress:
        return scheduler(services, on_progress, segment_fn=segment_fn).run(sweep_id)


def stored_estimates(segments: Sequence[SegmentRecord], flops_per_s: float | None) -> Estimates:
    """What the plan estimated of each recorded segment, from the store (as the server's timing does)."""
    return Estimates({s.key: stored_seconds(s, flops_per_s) for s in segments}, {s.key: s.tokens for s in segments})


def start_ray(settings: Settings, watch: RunWatch) -> None:
    """Ray up (embedded, or RAY_ADDRESS's), said to ``watch`` with how long it took: tens of seconds of silence
    otherwise."""
    if ray.is_initialized():
        return
    what = f"Ray at {settings.ray_address}" if settings.ray_address else "embedded Ray (tens of seconds)"
    t0 = time.monotonic()
    with watch.starting_ray(what):
        ensure_ray(settings)
    watch.note(f"Ray started in {time.monotonic() - t0:.0f} s")


def prepare_data(settings: Settings, watch: RunWatch, data: DataSpec, context: int) -> None:
    """Before a CPU sweep trains on this machine: `announce_op_build`, and build the token cache here (the workers
    then find it) rather than silently inside the first segments. A cluster (RAY_ADDRESS) has its own caches."""
    if settings.ray_address:
        return
    announce_op_build(watch)
    build_token_cache(watch, data, context, settings.data_cache_dir)


def announce_op_build(watch: RunWatch) -> None:
    """Say so before DeepSpeed compiles its CPU op (minutes, once): otherwise the first segment just seems stuck."""
    folder = pending_op_build()
    if folder is not None:
        watch.note(f"note: the first segment builds DeepSpeed's CPU communication op once (about {OP_BUILD_NOTE}, "
                   f"compiling C++); it is cached in {folder}")


def build_token_cache(watch: RunWatch, data: DataSpec, context: int, cache_dir: Path | None) -> None:
    """`load_tokens` told to ``watch``, which hears of it only if the cache has to be built (a BPE trained, the
    corpus encoded): seconds to minutes, once per corpus and tokeniser."""
    from upscale.workers.data import default_cache_dir, load_tokens  # torch: the server's sweep loop never needs it

    cache_dir = cache_dir or default_cache_dir()
    with watch.tokenising(f"tokenising {data.corpus} ({data.tokenizer}; once, cached in {cache_dir})") as progress:
        load_tokens(data, context, cache_dir, progress=progress)
