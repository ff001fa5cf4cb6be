"""Live progress on stderr for the CLI's long work: sweeps (segments, tokens, time left), the analysis's stages, Ray's
start, the token cache, and the one-time DeepSpeed op build, announced before it happens.

The library reports through plain callbacks (the scheduler's `on_progress`, `load_tokens(progress=)`); only this
module (and `fit_commands.progress_bar`) turns them into rich output. stderr keeps `--json` stdout clean.
"""

from __future__ import annotations

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


class _TimeLeft(ProgressColumn):
    """The sweep's time left, recomputed at every refresh so that it counts down between segment events."""

    def render(self, task: Task) -> Text:
        from upscale.sweeps.planner import eta_s

        f = task.fields
        if f.get("planned_s") is None or task.finished:
            return Text("")
        left = eta_s(f["planned_s"], f["planned_done_s"], time.monotonic() - f["started"])
        return Text(f"ETA {timedelta(seconds=round(left))}", style="progress.remaining")


class SweepBar:
    """One sweep's bar: segments done/total, tokens done/total and the time left, from the plan's estimate (`upscale
    plan`'s) until a segment finishes, then at the pace measured so far. Segments already done when it starts
    (reused from earlier sweeps or runs) count as done but not in the pace."""

    def __init__(self, bar: Progress, spec: SweepSpec | None, label: str) -> None:
        self.seconds: dict[str, float] = {}
        self.tokens: dict[str, int] = {}
        if spec is not None:
            from upscale.sweeps.planner import gpu_flops_per_s, plan, segment_seconds

            p = plan(spec)
            self.seconds = segment_seconds(p, flops_per_s=gpu_flops_per_s(spec))
            self.tokens = {s.id: s.tokens for s in p.segments}
        self.bar, self.reused = bar, None
        self.task = bar.add_task(label, total=None, note="", tokens="", planned_s=None, planned_done_s=0.0,
                                 started=time.monotonic())

    def show(self, p: SchedulerProgress) -> None:
        """The scheduler's `on_progress` callback."""
        if p.message:
            self.bar.update(self.task, note=p.message)
        else:
            self.update(set(p.done_keys), p.total)

    def update(self, done: set[str], total: int, note: str | None = None) -> None:
        if self.reused is None:
            self.reused = frozenset(done)
            self.bar.update(self.task, planned_s=sum(s for k, s in self.seconds.items() if k not in self.reused),
                            started=time.monotonic())
        fresh = done - self.reused
        tokens = (f"{_count(sum(self.tokens.get(k, 0) for k in done))}/{_count(sum(self.tokens.values()))} tokens"
                  if self.tokens else "")
        fields: dict[str, Any] = {"tokens": tokens, "planned_done_s": sum(self.seconds.get(k, 0.0) for k in fresh)}
        if note is not None:
            fields["note"] = note
        self.bar.update(self.task, total=total, completed=len(done), **fields)


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


@contextmanager
def sweep_bar(spec: SweepSpec | None, label: str, transient: bool = False) -> Iterator[SweepBar]:
    """A live `SweepBar` on stderr; ``spec`` (None: unknown) gives the plan for the tokens and the time left."""
    fixed = Column(no_wrap=True)
    columns = (TextColumn("{task.description}", table_column=fixed), BarColumn(bar_width=20), MofNCompleteColumn(),
               TextColumn("{task.fields[tokens]}", table_column=fixed), TimeElapsedColumn(),
               _TimeLeft(table_column=fixed),  # the scheduler's last event, cut to what the terminal leaves
               TextColumn("{task.fields[note]}", table_column=Column(no_wrap=True, overflow="ellipsis", max_width=48)))
    with Progress(*columns, console=err_console, transient=transient) as bar:
        yield SweepBar(bar, spec, label)


def start_ray(settings: Settings) -> None:
    """`ensure_ray` under a status line: an embedded Ray takes tens of seconds to start and says nothing meanwhile."""
    with err_console.status("starting Ray…"):
        from upscale.orchestrator.scheduler import ensure_ray

        ensure_ray(settings)


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
                task = bar.add_task(f"tokenising {data.corpus} ({data.tokenizer}; once, cached in {cache_dir})",
                                    total=None)
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
        bars.update(tasks[stage], completed=done)

    try:
        yield update
    finally:
        if tasks:
            bars.stop()


def workers_for(n_boot: int) -> int:
    """Two processes for a real bootstrap (the machines have 2 cores); one for a short one (no pool start-up)."""
    return min(2, os.cpu_count() or 1) if n_boot >= 100 else 1
