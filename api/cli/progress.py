"""Live progress on stderr for the CLI's long work: sweeps (segments, tokens, time left), the analysis's stages, Ray's
start, the token cache, and the one-time DeepSpeed op build, announced before it happens.

The library reports through plain callbacks (the scheduler's `on_progress`, `load_tokens(progress=)`); only this
module (and `fit_commands.progress_bar`) turns them into rich output. stderr keeps `--json` stdout clean.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.text import Text

from upscale.api.cli.app import err_console

if TYPE_CHECKING:
    from pathlib import Path

    from rich.progress import Task

    from upscale.fitting.analysis import Progress as AnalysisProgress
    from upscale.orchestrator.scheduler import Progress as SchedulerProgress
    from upscale.orchestrator.settings import Settings
    from upscale.sweeps.segments import DataSpec
    from upscale.sweeps.spec import SweepSpec

# Rough wall time of DeepSpeed's one-time op build on a 2-core machine (compiler-bound).
OP_BUILD_NOTE = "1-3 min"


# Off a terminal (a pipe, a log file) the bar cannot redraw: a line per finished segment, and one at least this often.
LINE_EVERY_S = 30.0


class _TimeLeft(ProgressColumn):
    """The sweep's time left, recomputed at every refresh so that it counts down between segment events."""

    def render(self, task: Task) -> Text:
        sweep: SweepBar | None = task.fields.get("sweep")
        if sweep is None or task.finished or not sweep.started:
            return Text("")
        return Text(f"ETA {left_text(sweep.time_left())}", style="progress.remaining")


def left_text(seconds: float | None) -> str:
    """A time left as `upscale` prints it, rounded up (a fraction of a second left is not 0:00:00); None (only
    running segments left, past the plan) says so."""
    return "unknown (past the plan's estimate)" if seconds is None else str(timedelta(seconds=math.ceil(seconds)))


class SweepBar:
    """One sweep's progress: segments done/total, tokens done/total and the time left. On a terminal a live bar
    (``bar``); elsewhere (``bar`` None) a line on stderr per finished segment, and every LINE_EVERY_S at least.

    The time left is the server's (GET /sweeps/{id} `timing`, control/timing.py) when ``update`` is given it, counted
    down between polls; otherwise, under an in-process scheduler, the plan's estimate (`upscale plan`'s) of what trains
    until a segment finishes, then at the pace measured so far. Segments already done when it starts (reused from
    earlier sweeps or runs) count as done but neither in the time planned nor in the pace."""

    def __init__(self, bar: Progress | None, spec: SweepSpec | None, label: str) -> None:
        self.seconds: dict[str, float] = {}
        self.tokens: dict[str, int] = {}
        if spec is not None:
            from upscale.sweeps.planner import gpu_flops_per_s, plan, segment_seconds

            p = plan(spec)
            self.seconds = segment_seconds(p, flops_per_s=gpu_flops_per_s(spec))
            self.tokens = {s.id: s.tokens for s in p.segments}
        self.bar, self.label = bar, label
        self.reused: frozenset[str] | None = None
        self.started = 0.0  # monotonic time of the first update
        self.planned_s = self.planned_done_s = 0.0
        self.told: tuple[float, float | None] | None = None  # (monotonic time, seconds left) the server said
        self.line: tuple[int, float] = (-1, 0.0)  # (segments done, monotonic time) of the last line printed
        self.task = bar.add_task(label, total=None, note="", tokens="", sweep=self) if bar is not None else None

    def show(self, p: SchedulerProgress) -> None:
        """The scheduler's `on_progress` callback."""
        if p.message:
            if self.bar is not None:
                self.bar.update(self.task, note=p.message)
        else:
            self.update(set(p.done_keys), p.total)

    def update(self, done: set[str], total: int, note: str | None = None, time_left_s: float | None = None,
               told: bool = False) -> None:
        """``done`` of ``total`` segments; ``told``: ``time_left_s`` is the server's figure (None: past the plan)."""
        now = time.monotonic()
        if self.reused is None:
            self.reused, self.started = frozenset(done), now
            self.planned_s = sum(s for k, s in self.seconds.items() if k not in self.reused)
        self.planned_done_s = sum(self.seconds.get(k, 0.0) for k in done - self.reused)
        if told:
            self.told = (now, time_left_s)
        tokens = (f"{_count(sum(self.tokens.get(k, 0) for k in done))}/{_count(sum(self.tokens.values()))} tokens"
                  if self.tokens else "")
        if self.bar is not None:
            fields: dict[str, Any] = {"tokens": tokens} | ({"note": note} if note is not None else {})
            self.bar.update(self.task, total=total, completed=len(done), **fields)
        elif len(done) != self.line[0] or now - self.line[1] >= LINE_EVERY_S:
            self.line = (len(done), now)
            complete = bool(total) and len(done) == total
            parts = [f"{len(done)}/{total} segments", tokens, f"{timedelta(seconds=round(now - self.started))} elapsed",
                     None if complete else f"time left {left_text(self.time_left())}",
                     "done" if complete and note is None else note]
            err_console.print(f"{self.label}: " + ", ".join(p for p in parts if p), highlight=False, soft_wrap=True)

    def time_left(self) -> float | None:
        """Seconds left now: the server's last figure counted down (None once it runs out: past its estimate), or
        the plan's estimate at the pace measured so far (sweeps/planner.py `eta_s`)."""
        from upscale.sweeps.planner import eta_s

        now = time.monotonic()
        if self.told is not None:
            at, left = self.told
            if not left:  # None (past the estimate) or 0 (nothing left)
                return left
            remaining = left - (now - at)
            return remaining if remaining > 0 else None
        return eta_s(self.planned_s, self.planned_done_s, now - self.started)


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


@contextmanager
def sweep_bar(spec: SweepSpec | None, label: str, transient: bool = False) -> Iterator[SweepBar]:
    """A `SweepBar` on stderr: live on a terminal, lines elsewhere; ``spec`` (None: unknown) gives the plan for the
    tokens and the time left."""
    if not err_console.is_terminal:
        yield SweepBar(None, spec, label)
        return
    fixed = Column(no_wrap=True)
    columns = (TextColumn("{task.description}", table_column=fixed), BarColumn(bar_width=20), MofNCompleteColumn(),
               TextColumn("{task.fields[tokens]}", table_column=fixed), TimeElapsedColumn(),
               _TimeLeft(table_column=fixed),  # the scheduler's last event, cut to what the terminal leaves
               TextColumn("{task.fields[note]}", table_column=Column(no_wrap=True, overflow="ellipsis", max_width=48)))
    with Progress(*columns, console=err_console, transient=transient) as bar:
        yield SweepBar(bar, spec, label)


def start_ray(settings: Settings) -> None:
    """`ensure_ray` under a status line (off a terminal, a line), then how long it took: an embedded Ray takes tens
    of seconds to start and says nothing meanwhile."""
    import ray

    from upscale.orchestrator.scheduler import ensure_ray

    if ray.is_initialized():
        return
    what = f"Ray at {settings.ray_address}" if settings.ray_address else "embedded Ray (tens of seconds)"
    t0 = time.monotonic()
    if err_console.is_terminal:
        with err_console.status(f"starting {what}…"):
            ensure_ray(settings)
    else:
        err_console.print(f"starting {what}…", highlight=False, soft_wrap=True)
        ensure_ray(settings)
    err_console.print(f"Ray started in {time.monotonic() - t0:.0f} s", highlight=False)


def prepare_training(spec: SweepSpec, settings: Settings) -> None:
    """Before a CPU sweep trains on this machine: announce DeepSpeed's one-time op build, and build the token cache
    here with a bar (the workers then find it) rather than silently inside the first segments."""
    if spec.resources.gpus or settings.ray_address:  # a GPU sweep builds no CPU op; a cluster has its own caches
        return
    from upscale.sweeps.planner import plan

    announce_op_build()
    first = plan(spec).segments[0].spec
    load_tokens_with_bar(first.data, first.model.context, settings.data_cache_dir)


def announce_op_build() -> None:
    """Say so before DeepSpeed compiles its CPU op (minutes, once): otherwise the first segment just seems stuck."""
    from upscale.workers.distributed import pending_op_build

    folder = pending_op_build()
    if folder is not None:
        err_console.print(f"[yellow]note[/]: the first segment builds DeepSpeed's CPU communication op once (about "
                          f"{OP_BUILD_NOTE}, compiling C++); it is cached in {folder}", highlight=False)


def load_tokens_with_bar(data: DataSpec, context: int, cache_dir: Path | None) -> None:
    """`load_tokens` with a bar that appears only if the token cache has to be built (a BPE trained, the corpus
    encoded): seconds to minutes, once per corpus and tokeniser."""
    from upscale.workers.data import default_cache_dir, load_tokens

    cache_dir = cache_dir or default_cache_dir()

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = None

        def show(done: int, total: int) -> None:
            nonlocal task
            if task is None:
                what = f"tokenising {data.corpus} ({data.tokenizer}; once, cached in {cache_dir})"
                task = bar.add_task(what, total=None)
                if not err_console.is_terminal:  # the bar cannot show there: say what the wait is
                    err_console.print(f"{what}…", highlight=False, soft_wrap=True)
            bar.update(task, completed=done, total=total or None)

        load_tokens(data, context, cache_dir, progress=show)


@contextmanager
def stage_bars() -> Iterator[AnalysisProgress]:
    """One bar per stage of the analysis (fitting/analysis.py), on stderr; yields analyze's ``progress`` callback.
    The bars appear with the first stage, so work that fails or is found done before any leaves no trace."""
    bars = Progress(*Progress.get_default_columns(), TimeElapsedColumn(), console=err_console, transient=True)
    tasks: dict[str, Any] = {}

    def update(stage: str, done: int, total: int) -> None:
        if not tasks:
            bars.start()
        if stage not in tasks:
            tasks[stage] = bars.add_task(stage, total=total)
            if not err_console.is_terminal:  # the bars cannot show there: a line per stage
                err_console.print(f"analysis: {stage} ({total})", highlight=False, soft_wrap=True)
        bars.update(tasks[stage], completed=done)

    try:
        yield update
    finally:
        if tasks:
            bars.stop()


def workers_for(n_boot: int) -> int:
    """Two processes for a real bootstrap (the machines have 2 cores); one for a short one (no pool start-up)."""
    return min(2, os.cpu_count() or 1) if n_boot >= 100 else 1
