"""`upscale submit|status|sweeps|observations|cancel`: record sweeps, follow them, export their observations, stop
them.

Each is one code path through `connect` (api/cli/local.py): `upscale.Client` over HTTP with `--api URL` (token from
`--token` or UPSCALE_TOKEN), else `Local`, the same calls into control/ in-process on this machine's store (no token:
whoever holds the database needs none). `upscale sweeps` is `upscale status` without an id, in-process. In-process,
nothing trains a submitted sweep unless `submit --wait` (which runs it here) or an `upscale serve`/`upscale scheduler`
is running.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from upscale.api.cli.app import CommandError, console, err_console
from upscale.api.cli.local import ApiOpt, Local, TokenOpt, connect
from upscale.api.cli.plan_commands import print_plan
from upscale.api.cli.segment_commands import axes_text
from upscale.client import Client
from upscale.orchestrator.errors import OrchestratorError

FINAL = ("done", "failed", "cancelled")
KINDS = ("dense", "upcycled", "scratch", "expanded")


def submit_command(
    spec: Annotated[Path, typer.Argument(help="Sweep spec, YAML or JSON.")],
    wait: Annotated[bool, typer.Option("--wait", help="Show progress until the sweep ends (in-process: train it "
                                       "here).")] = False,
    new: Annotated[bool, typer.Option("--new", help="Record a new sweep even if you already have one of this "
                                      "identical spec (default: that one is returned).")] = False,
    reuse_stale: Annotated[bool, typer.Option("--reuse-stale", help="Reuse segments trained under an older "
                                              "training-semantics version instead of retraining them.")] = False,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Submit a sweep: prints its id and the summary `upscale plan` prints (segments and FLOPs to train, the WSD
    saving, the time estimate, the laws the grid cannot identify). An identical spec you already submitted returns
    that sweep (resumed if it failed or was cancelled) unless --new."""
    with connect(api, token) as c:  # a missing or unreadable spec: main() prints the OSError as one line
        out = c.submit(spec, new=new, reuse_stale=reuse_stale)
        p = out["plan"]
        if out["existing"]:
            err_console.print(f"sweep {out['id']} already has this identical spec ({out['status']}): returning it; "
                              "--new records another")
        console.print(f"sweep {out['id']} ({out['name']}), {out['status']}")
        print_plan(p)  # the summary `upscale plan` prints: costs, the time estimate, what the grid cannot identify
        if wait:
            _wait(c, out["id"])


def _wait(c: Client | Local, sweep_id: str) -> None:
    """A progress bar (lines when stderr is no terminal) until the sweep ends. In-process nobody else trains it, so
    it runs here on the road (control/runs.py `run_recorded`), on the same store (and its hooks); over HTTP the bar
    shows the time left the server computes from what the sweep trains (control/timing.py)."""
    from upscale.api.cli.progress import BarWatch, sweep_bar

    if isinstance(c, Local):
        from upscale.control.runs import run_recorded

        run_recorded(c.services, sweep_id, BarWatch())
        d = c.sweep(sweep_id)
    else:
        d = c.sweep(sweep_id)
        tokens = {s["key"]: s["tokens"] for s in d["segments"]}  # what each trains, as the server planned it
        with sweep_bar(f"sweep {sweep_id}", tokens) as bar:
            while True:
                bar.update({s["key"] for s in d["segments"] if s["status"] == "done"}, d["segments_total"],
                           d["status"], time_left_s=d["timing"]["time_left_s"], told=True)
                if d["status"] in FINAL:
                    break
                time.sleep(2.0)
                d = c.sweep(sweep_id)
    if d["status"] != "done":
        raise CommandError(f"sweep {sweep_id} {d['status']}: {d['error'] or 'stopped'}")


def sweeps_table(rows: list[dict[str, Any]]) -> Table:
    """GET /sweeps as a table: what `upscale sweeps` and `upscale status` print."""
    t = Table("sweep", "name", "status", "owner", "segments done", "created")
    for s in rows:
        t.add_row(s["id"], s["name"], s["status"], s["owner"] or "", f"{s['segments_done']}/{s['segments_total']}",
                  s["created_at"][:16].replace("T", " "))
    return t


def status_command(
    sweep: Annotated[str | None, typer.Argument(help="Sweep id; none: every sweep.")] = None,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Sweeps and their progress; with an id, its segments (kind, grid axes, status) and the FLOPs done vs planned."""
    with connect(api, token) as c:
        if sweep is None:
            console.print(sweeps_table(c.sweeps()))
            return
        d = c.sweep(sweep)
    t = Table("kind", "axes", "status", "attempts", "tokens", "val_loss", "error",
              title=f"sweep {d['id']} ({d['name']}): {d['status']}, {d['segments_done']}/{d['segments_total']} done, "
                    f"{d['flops_done']:.3g} of {d['flops_planned']:.3g} FLOPs")
    for s in d["segments"]:
        t.add_row(s["kind"], axes_text(s["axes"]), s["status"], str(s["attempts"]), str(s["tokens"]),
                  "" if s["val_loss"] is None else f"{s['val_loss']:.4f}", (s["error"] or "")[:60])
    console.print(t)
    if d["error"]:  # whole: its cause comes first, and a cell would cut it
        console.print(f"{d['status']}: {d['error']}", highlight=False, markup=False, soft_wrap=True)
    console.print(timing_line(d["timing"], d["status"]), highlight=False, soft_wrap=True)
    if d["stale_segments"]:
        console.print(f"{len(d['stale_segments'])} segment(s) were stale (trained under an older training-semantics "
                      f"version) when it was recorded: {'reused (--reuse-stale)' if d['reuse_stale'] else 'retrained'}")


def timing_line(t: dict[str, Any], status: str) -> str:
    """A sweep's `timing` (GET /sweeps/{id}) in a line: what it trains and reuses, the plan's time, the time left."""
    from upscale.api.cli.plan_commands import duration
    from upscale.api.cli.progress import left_text

    parts = [f"trains {t['segments_to_train']} segment(s) ({t['segments_trained']} done), reuses "
             f"{t['segments_reused']}", f"planned {duration(t['planned_s'])} one at a time ({t['basis']})"]
    if t["elapsed_s"] is not None:
        parts.append(f"{duration(t['elapsed_s'])} elapsed")
    if t["tokens_per_s"] is not None:
        parts.append(f"{t['tokens_per_s']:.3g} tokens/s per segment")
    if status not in FINAL and t["segments_trained"] < t["segments_to_train"]:
        parts.append(f"time left {left_text(t['time_left_s'])} (at {t['as_of'][11:19]} UTC)")
    return "; ".join(parts)


def sweeps_command() -> None:
    """Every sweep in the store with its status and how many of its segments are done."""
    with Local() as c:
        console.print(sweeps_table(c.sweeps()))


def observations_command(
    sweep: Annotated[str, typer.Argument(help="Sweep id (`upscale sweeps` lists them).")],
    csv: Annotated[bool, typer.Option("--csv", help="Write CSV in the columns `upscale fit --data` reads.")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Write to this file instead of stdout.")] = None,
    kind: Annotated[str | None, typer.Option(help=f"Only rows of one kind: {', '.join(KINDS)} (a law's table, or "
                                             "the expanded MoEs').")]
    = None,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """A sweep's observations: N, D (dense and from-scratch rows), N1, D1, D2, N2, P (upcycled and expanded rows),
    parent_experts (expanded rows), loss, trunk."""
    if kind is not None and kind not in KINDS:
        raise OrchestratorError(f"--kind {kind!r}: use one of {', '.join(KINDS)}")
    with connect(api, token) as c:
        if csv or out is not None:
            text = c.observations_csv(sweep, kind)  # type: ignore[arg-type]  (checked above)
            if out is None:
                sys.stdout.write(text)
            else:
                out.write_text(text)
                err_console.print(f"{len(text.splitlines()) - 1} observation(s) written to {out}")
            return
        df = c.observations(sweep, kind)  # type: ignore[arg-type]
    console.print(df.to_string(index=False))


def cancel_command(sweep: Annotated[str, typer.Argument(help="Sweep id.")], api: ApiOpt = None,
                   token: TokenOpt = None) -> None:
    """Ask the scheduler running SWEEP to stop; running segments are released and resume on the next run."""
    with connect(api, token) as c:
        status = c.cancel(sweep)["status"]
    console.print(f"sweep {sweep}: {status}")
