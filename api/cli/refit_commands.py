"""`upscale refit schedule create|list|delete`, `upscale refit run` and `upscale refit history`: refit schedules
from the command line, in-process on this machine's store or with `--api` on a server (POST, GET and DELETE
/refit-schedules, POST /refit-schedules/{id}/run, GET /refits), one code path through `connect`
(api/cli/local.py).

A schedule reruns the analysis on its sweeps' observations on a cron or whenever they change, and records a new
version only when they changed; `create` prints the new schedule's id alone on stdout, so that a script can keep it
(`SCHEDULE=$(upscale refit schedule create ...)`), and what it will do on stderr.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from upscale.api.cli.app import CommandError, console, err_console
from upscale.api.cli.fit_commands import JsonOpt, flags_text, fmt, interval_text, print_json, row_notes
from upscale.api.cli.local import ApiOpt, TokenOpt, connect
from upscale.control.schemas import DEFAULT_ANALYSIS_BOOTSTRAP, MAX_BOOTSTRAP, MAX_N1
from upscale.fitting import display

refit_app = typer.Typer(help="Refit schedules: the analysis rerun on a cron or whenever the sweeps' observations "
                        "change, each change a new version with D* and what moved.", no_args_is_help=True)
schedule_app = typer.Typer(help="Create, list and delete refit schedules.", no_args_is_help=True)
refit_app.add_typer(schedule_app, name="schedule")


def when_text(schedule: dict[str, Any]) -> str:
    """When a schedule refits, in words."""
    if schedule["trigger"] == "cron":
        return f"cron '{schedule['cron']}' (UTC), a new version only when the observations changed"
    return "whenever the observations change"


def request_text(request: dict[str, Any]) -> str:
    """What each refit of a schedule runs, its defaults named."""
    n1 = fmt(request["n1"]) if request.get("n1") is not None else "the largest size trained"
    return (f"sweeps {', '.join(request['sweep_ids'])}; D* at N1 = {n1}; {request['bootstrap']} bootstrap refits per "
            f"fit")


@schedule_app.command("create")
def schedule_create_command(
    sweeps: Annotated[list[str], typer.Argument(help="Sweep ids whose observations each refit analyses (anyone's; "
                                                "`upscale sweeps` lists them).")],
    name: Annotated[str | None, typer.Option(help="What the schedule is for (default: 'refit of SWEEPS').")] = None,
    cron: Annotated[str | None, typer.Option(help="Refit on this 5-field cron (minute hour day month weekday, UTC), "
                                             "e.g. '0 3 * * *'; default: whenever the sweeps' observations "
                                             "change.")] = None,
    n1: Annotated[float | None, typer.Option("--n1", min=1, max=MAX_N1, help="Dense size N1 (a parameter count) to "
                                             "report D* at; default: the largest size the sweeps trained.")] = None,
    bootstrap: Annotated[int, typer.Option(min=0, max=MAX_BOOTSTRAP, help="Cluster-bootstrap refits per fit (0: no "
                                           "interval on D*).")] = DEFAULT_ANALYSIS_BOOTSTRAP,
    as_json: JsonOpt = False,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Create a refit schedule: its id on stdout (the schedule with --json), what it will do on stderr."""
    request = {"sweep_ids": sweeps, "bootstrap": bootstrap, "n1": n1}
    with connect(api, token) as c:
        out = c.create_refit_schedule(name or f"refit of {', '.join(sweeps)}", request,
                                      "cron" if cron is not None else "on_new_observations", cron)
    if as_json:
        print_json(out)
        return
    print(out["id"])
    err_console.print(f"refit schedule {out['id']} ({escape(out['name'])}): {when_text(out)}; "
                      f"{request_text(out['request'])}", highlight=False, soft_wrap=True)


@schedule_app.command("list")
def schedule_list_command(
    include_deleted: Annotated[bool, typer.Option("--all", help="Also the deleted schedules.")] = False,
    as_json: JsonOpt = False,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Every owner's refit schedules: when each refits, what, its latest version and its last error."""
    with connect(api, token) as c:
        schedules = c.refit_schedules(include_deleted)
        latest = {r["schedule_id"]: r["version"] for r in c.refits()} if schedules else {}
    if as_json:
        print_json(schedules)
        return
    if not schedules:
        err_console.print("no refit schedules; `upscale refit schedule create SWEEP` creates one")
        return
    table = Table("id", "name", "when", "what", "owner", "versions", "state")
    for s in schedules:
        state = ("active" if s["active"] else "deleted") + (f"\nlast refit failed: {s['last_error']}"
                                                             if s["last_error"] else "")
        table.add_row(s["id"], s["name"], when_text(s), request_text(s["request"]), s["owner"],
                      str(latest.get(s["id"], 0)), state)
    console.print(table)


@schedule_app.command("delete")
def schedule_delete_command(
    schedule: Annotated[str, typer.Argument(help="Refit schedule id (`upscale refit schedule list`).")],
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Stop a refit schedule; its versions are kept (`upscale refit history SCHEDULE`)."""
    with connect(api, token) as c:
        c.delete_refit_schedule(schedule)
    err_console.print(f"deleted refit schedule {schedule}; `upscale refit history {schedule}` keeps its versions")


def dstar_text(refit: dict[str, Any]) -> str:
    """A version's D*, where it is of, its 95% interval and its marks."""
    answer = refit["dstar_answer"]
    if answer is None:
        return "no D* (the analysis has no from-scratch and upcycled laws to compare)"
    return (f"D* at N1={fmt(answer['n1'])}: {display.dstar(answer)} ({refit['dstar_group'] or 'upcycled'}; 95% "
            f"{interval_text((answer['intervals'] or {}).get('95'))}; {flags_text(answer)})")


@refit_app.command("run")
def run_command(
    schedule: Annotated[str | None, typer.Argument(help="Refit schedule id; none: every active schedule.")] = None,
    as_json: JsonOpt = False,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Refit now: when the observations changed since the latest version, the analysis on each schedule's sweeps
    and a new version with D*, its interval and whether it left the previous one; else the latest version again."""
    with connect(api, token) as c:
        ids = [schedule] if schedule else [s["id"] for s in c.refit_schedules()]
        if not ids:
            raise CommandError("no refit schedules; `upscale refit schedule create SWEEP` creates one")
        runs = [c.run_refit(sid) for sid in ids]
    if as_json:
        print_json(runs)
        return
    for sid, r in zip(ids, runs, strict=True):
        what = (f"v{r['version']} again: the observations have not changed since it, nothing recorded"
                if r["unchanged"] else f"v{r['version']}")
        flag = "  [bold red]D* left the previous interval[/]" if r["left_interval"] else ""
        console.print(f"schedule {sid} {what}; analysis {r['analysis_id']}, {dstar_text(r)}{flag}",
                      highlight=False, soft_wrap=True)
        for note in row_notes(r["dstar_answer"] or {}):
            console.print(f"[yellow]{escape(note)}[/]", highlight=False, soft_wrap=True)


@refit_app.command("history")
def history_command(
    schedule: Annotated[str | None, typer.Argument(help="Refit schedule id; none: every schedule's versions.")]
    = None,
    as_json: JsonOpt = False,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Every refit version, oldest first: when, the analysis it ran, D* and its 95% interval, how far D* moved, and
    whether it left the previous interval."""
    with connect(api, token) as c:
        versions = c.refits(schedule)
    if as_json:
        print_json(versions)
        return
    if not versions:
        err_console.print(f"no refit versions{f' of schedule {schedule}' if schedule else ''} yet; `upscale refit "
                          f"run` refits now")
        return
    table = Table("schedule", "version", "created (UTC)", "analysis", "D*", "moved", "left interval")
    for v in versions:
        moved = v["diff"].get("dstar")
        table.add_row(v["schedule_id"], str(v["version"]), v["created_at"][:19].replace("T", " "), v["analysis_id"],
                      dstar_text(v), "" if moved is None else f"{moved:+.3g}",
                      "[bold red]yes[/]" if v["left_interval"] else "no")
    console.print(table)
