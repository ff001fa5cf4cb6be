"""Live progress on stderr for the CLI's long work: sweeps (segments, tokens, time left), the analysis's stages, Ray's
start, the token cache, and the one-time DeepSpeed op build, announced before it happens.

The library reports through plain callbacks and control/runs.py's `RunWatch` (the road that runs a sweep here), which
`BarWatch` implements; only this module (and `fit_commands.progress_bar`) turns them into rich output. stderr keeps
`--json` stdout clean.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.text import Text

from upscale.api.cli.app import err_console

if TYPE_CHECKING:  # the CLI loads the road (and Ray) only in the commands that run a sweep
    from rich.progress import Task

    from upscale.control.runs import Estimates
    from upscale.control.runs import Progress as SchedulerProgress
    from upscale.fitting.analysis import Progress as AnalysisProgress

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
    down between polls; otherwise, under an in-process scheduler, the plan's estimate (`upscale plan`'s) of what
    trains until a segment finishes, then at the pace measured since (`eta_s`). Segments already done when it starts
    (reused from earlier sweeps or runs) count as done but neither in the time planned nor in the pace. ``tokens``
    and ``seconds`` are each segment's, as planned (the road's estimates, control/runs.py): nothing is planned here."""

    def __init__(self, bar: Progress | None, label: str, tokens: dict[str, int] | None = None,
                 seconds: dict[str, float] | None = None) -> None:
        self.tokens, self.seconds = tokens or {}, seconds or {}
        self.bar, self.label = bar, label
        self.reused: frozenset[str] | None = None
        self.started = 0.0  # monotonic time of the first update
        self.planned_s = self.planned_done_s = 0.0
        self.first: tuple[float, float] | None = None  # (seconds since the start, planned seconds) at the first finish
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
        if self.first is None and self.planned_done_s > 0:
            self.first = (now - self.started, self.planned_done_s)
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
        the plan's estimate at the pace measured since the first segment finished (sweeps/planner.py `eta_s`)."""
        from upscale.sweeps.planner import eta_s

        now = time.monotonic()
        if self.told is not None:
            at, left = self.told
            if not left:  # None (past the estimate) or 0 (nothing left)
                return left
            remaining = left - (now - at)
            return remaining if remaining > 0 else None
        return eta_s(self.planned_s, self.planned_done_s, now - self.started, first=self.first)


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


@contextmanager
def sweep_bar(label: str, tokens: dict[str, int] | None = None, seconds: dict[str, float] | None = None,
              transient: bool = False) -> Iterator[SweepBar]:
    """A `SweepBar` on stderr: live on a terminal, lines elsewhere; ``tokens`` and ``seconds`` (each segment's, as
    planned; none: unknown) give the tokens and the time left."""
    if not err_console.is_terminal:
        yield SweepBar(None, label, tokens, seconds)
        return
    fixed = Column(no_wrap=True)
    columns = (TextColumn("{task.description}", table_column=fixed), BarColumn(bar_width=20), MofNCompleteColumn(),
               TextColumn("{task.fields[tokens]}", table_column=fixed), TimeElapsedColumn(),
               _TimeLeft(table_column=fixed),  # the scheduler's last event, cut to what the terminal leaves
               TextColumn("{task.fields[note]}", table_column=Column(no_wrap=True, overflow="ellipsis", max_width=48)))
    with Progress(*columns, console=err_console, transient=transient) as bar:
        yield SweepBar(bar, label, tokens, seconds)


class BarWatch:
    """control/runs.py's `RunWatch` on stderr: notes as lines, a status line while Ray starts, a bar while the token
    cache is built (only if it is), and the sweep's `SweepBar` (``transient``: gone when it ends, for `--json`)."""

    def __init__(self, transient: bool = False) -> None:
        self.transient = transient

    def note(self, text: str) -> None:
        err_console.print(text, highlight=False, soft_wrap=True)

    @contextmanager
    def starting_ray(self, what: str) -> Iterator[None]:
        if err_console.is_terminal:
            with err_console.status(f"starting {what}…"):
                yield
        else:
            err_console.print(f"starting {what}…", highlight=False, soft_wrap=True)
            yield

    @contextmanager
    def tokenising(self, what: str) -> Iterator[Callable[[int, int], None]]:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err_console, transient=True) as bar:
            task = None

            def show(done: int, total: int) -> None:
                nonlocal task
                if task is None:
                    task = bar.add_task(what, total=None)
                    if not err_console.is_terminal:  # the bar cannot show there: say what the wait is
                        err_console.print(f"{what}…", highlight=False, soft_wrap=True)
                bar.update(task, completed=done, total=total or None)

            yield show

    @contextmanager
    def sweep(self, label: str, estimates: Estimates) -> Iterator[Callable[[SchedulerProgress], None]]:
        with sweep_bar(label, estimates.tokens, estimates.seconds, self.transient) as bar:
            yield bar.show


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
