"""`upscale serve|scheduler|submit|status|refit|ui`: run the control plane and talk to it.

`submit`, `status` and `refit` go through the REST routes either way, as `upscale.Client` calls: with `--api URL`
over HTTP to a remote server (token from `--token` or UPSCALE_TOKEN), otherwise to the same app in-process
(Starlette's TestClient, no network, no token: whoever holds the database needs none), so local and remote share
one code path. In-process, nothing
trains a submitted sweep unless `--wait` (which runs it here) or an `upscale serve`/`upscale scheduler` is running.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from upscale.api.cli.app import CommandError, app, console, err_console
from upscale.client import Client

ApiOpt = Annotated[str | None, typer.Option("--api", help="A remote server's URL, e.g. http://host:8000; default: "
                                            "in-process on this machine's store. UPSCALE_TIMEOUT: seconds to wait.")]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="UPSCALE_TOKEN", help="Bearer token for --api "
                                              "(`upscale token create`); reads need one too.")]
FINAL = ("done", "failed", "cancelled")


def api_client(api: str | None, token: str | None) -> Client:
    """upscale.Client over HTTP to the server at ``api``; else the same app in-process (no network, no token)."""
    if api:
        return Client(api, token)
    from fastapi.testclient import TestClient

    from upscale.api.app import create_app
    from upscale.orchestrator.settings import get_settings

    app_client = TestClient(create_app(get_settings(), auth=False, scheduler=False))
    return Client(str(app_client.base_url), http=app_client)


@app.command("serve")
def serve_command(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    no_scheduler: Annotated[bool, typer.Option("--no-scheduler", help="Serve only; run `upscale scheduler` "
                                               "elsewhere to train.")] = False,
    refit_tick_s: Annotated[float, typer.Option(help="How often refit schedules are checked (s).")] = 5.0,
) -> None:
    """The REST API (OpenAPI page at /docs) with the sweep scheduler, the analysis and the refit loops in the same
    process: a sweep that finishes is analysed by itself (UPSCALE_ANALYSIS_POLICY=off: only on request).
    Ctrl-C / SIGTERM shut down gracefully: running segments are released and their sweep resumes on restart."""
    import uvicorn

    from upscale.api.app import create_app
    from upscale.api.cli.progress import start_ray
    from upscale.orchestrator.settings import get_settings

    settings = get_settings()
    if not no_scheduler:
        start_ray(settings)  # from the main thread: Ray installs signal handlers
    uvicorn.run(create_app(settings, scheduler=not no_scheduler, refit_tick_s=refit_tick_s), host=host, port=port)


@app.command("scheduler")
def scheduler_command(
    refit_tick_s: Annotated[float, typer.Option(help="How often refit schedules are checked (s).")] = 5.0,
) -> None:
    """Only the background work of `upscale serve`: train pending sweeps, analyse sweeps that settle with new
    observations (UPSCALE_ANALYSIS_POLICY) and fire refit schedules, until Ctrl-C."""
    from upscale.api.cli.progress import start_ray
    from upscale.control.analyses import AnalysisLoop
    from upscale.control.refits import RefitLoop
    from upscale.control.services import Services
    from upscale.control.sweep_loop import SweepLoop
    from upscale.orchestrator.settings import get_settings

    services = Services.open(get_settings())
    start_ray(services.settings)
    loops = (SweepLoop(services), RefitLoop(services, tick_s=refit_tick_s), AnalysisLoop(services))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for loop in loops:
        loop.start()
    err_console.print(f"scheduler running on {services.settings.db_url}; Ctrl-C stops it")
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    for loop in loops:
        loop.stop()


@app.command("submit")
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
    """Submit a sweep: prints its id and plan (segments to train, FLOPs, WSD saving). An identical spec you already
    submitted returns that sweep (resumed if it failed or was cancelled) unless --new."""
    with api_client(api, token) as c:  # a missing or unreadable spec: main() prints the OSError as one line
        out = c.submit(spec, new=new, reuse_stale=reuse_stale)
        p = out["plan"]
        if out["existing"]:
            err_console.print(f"sweep {out['id']} already has this identical spec ({out['status']}): returning it; "
                              "--new records another")
        console.print(f"sweep {out['id']} ({out['name']}): {p['segments']} segments, {p['new_segments']} to train, "
                      f"{p['total_flops']:.3g} FLOPs ({p['saving']:.2f}x cheaper than independent runs)")
        if p["stale_segments"]:
            err_console.print(f"{len(p['stale_segments'])} segment(s) trained under an older training-semantics "
                              f"version: {'reused' if out['reuse_stale'] else 'retrained (--reuse-stale reuses them)'}")
        if wait:
            _wait(c, out["id"], remote=api is not None, spec=spec)


def _wait(client: Client, sweep_id: str, remote: bool, spec: Path) -> None:
    from upscale.api.cli.progress import prepare_training, start_ray, sweep_bar
    from upscale.sweeps.spec import load_spec

    sweep_spec = load_spec(spec)  # the plan the server made of it: tokens and the time left on the bar
    if not remote:
        start_ray(client.http.app.state.services.settings)
        prepare_training(sweep_spec, client.http.app.state.services.settings)
    with sweep_bar(sweep_spec, f"sweep {sweep_id}") as bar:
        if not remote:  # nobody else trains it: run the orchestrator's scheduler here, on the same store
            from upscale.orchestrator.scheduler import Scheduler

            services = client.http.app.state.services
            Scheduler(services.store, services.settings, on_progress=bar.show).run(sweep_id)
        while True:
            d = client.sweep(sweep_id)
            bar.update({s["key"] for s in d["segments"] if s["status"] == "done"}, d["segments_total"], d["status"])
            if d["status"] in FINAL:
                break
            time.sleep(2.0)
    if d["status"] != "done":
        raise CommandError(f"sweep {sweep_id} {d['status']}: {d['error'] or 'stopped'}")


@app.command("status")
def status_command(
    sweep: Annotated[str | None, typer.Argument(help="Sweep id; none: every sweep.")] = None,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Sweeps and their progress; with an id, its segments (kind, grid axes, status) and the FLOPs done vs planned."""
    with api_client(api, token) as c:
        if sweep is None:
            t = Table("sweep", "name", "status", "owner", "segments done", "created")
            for s in c.sweeps():
                t.add_row(s["id"], s["name"], s["status"], s["owner"] or "", f"{s['segments_done']}/"
                          f"{s['segments_total']}", s["created_at"][:16])
            console.print(t)
            return
        d = c.sweep(sweep)
    from upscale.api.cli.segment_commands import axes_text

    t = Table("kind", "axes", "status", "attempts", "tokens", "val_loss", "error",
              title=f"sweep {d['id']} ({d['name']}): {d['status']}, {d['segments_done']}/{d['segments_total']} done, "
                    f"{d['flops_done']:.3g} of {d['flops_planned']:.3g} FLOPs")
    for s in d["segments"]:
        t.add_row(s["kind"], axes_text(s["axes"]), s["status"], str(s["attempts"]), str(s["tokens"]),
                  "" if s["val_loss"] is None else f"{s['val_loss']:.4f}", (s["error"] or "")[:60])
    console.print(t)
    if d["stale_segments"]:
        console.print(f"{len(d['stale_segments'])} segment(s) were stale (trained under an older training-semantics "
                      f"version) when it was recorded: {'reused (--reuse-stale)' if d['reuse_stale'] else 'retrained'}")


@app.command("refit")
def refit_command(
    schedule: Annotated[str | None, typer.Argument(help="Refit schedule id; none: every active schedule.")] = None,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Refit now: the analysis on each schedule's sweeps, a new version with D*, its interval and whether it left
    the previous one."""
    with api_client(api, token) as c:
        ids = [schedule] if schedule else [s["id"] for s in c.refit_schedules()]
        if not ids:
            raise CommandError("no refit schedules; POST /refit-schedules creates one")
        for sid in ids:
            r = c.run_refit(sid)
            star = ("no D* (the analysis has no from-scratch and upcycled laws to compare)" if r["dstar"] is None
                    else f"D* {r['dstar']:.4g} ({r['dstar_group'] or 'upcycled'})")
            flag = "  [bold red]D* left the previous interval[/]" if r["left_interval"] else ""
            console.print(f"schedule {sid} v{r['version']}: analysis {r['analysis_id']}, {star}{flag}")


@app.command("ui")
def ui_command(
    launch: Annotated[bool, typer.Option("--launch", help="Run it instead of printing it.")] = False,
    port: Annotated[int, typer.Option(help="Port of the MLflow UI.")] = 5000,
) -> None:
    """The MLflow UI on this store's runs: one parent run per sweep, one child per segment. It runs through this
    interpreter (`python -m mlflow`), so it works without the virtualenv activated."""
    from upscale.orchestrator.settings import get_settings

    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", get_settings().mlflow_tracking_uri,
            "--port", str(port)]
    if not launch:
        print(shlex.join(argv))
        return
    if importlib.util.find_spec("mlflow") is None:
        raise CommandError(f"mlflow is not installed for {sys.executable}: pip install 'upscale[worker]'")
    os.execv(sys.executable, argv)
