"""`upscale serve|scheduler|ui`: run the control plane (the REST API and its background loops, or the loops alone)
and open the MLflow UI on its runs.

The commands that talk to a control plane (`submit`, `status`, `analyze`, `decide`, ...) reach it through
api/cli/local.py `connect`: `upscale.Client` with `--api URL`, else the same control/ calls in-process.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import sys
import threading
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

import typer

from upscale.api.cli.app import CommandError, err_console


def serve_command(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    no_scheduler: Annotated[bool, typer.Option("--no-scheduler", help="Serve only; run `upscale scheduler` "
                                               "elsewhere to train.")] = False,
    refit_tick_s: Annotated[float, typer.Option(help="How often refit schedules are checked (s).")] = 5.0,
    connection_limit: Annotated[int | None, typer.Option(min=2, help="Most connections held open; one more is closed "
                                                         "at once (default UPSCALE_CONNECTION_LIMIT, 1024).")] = None,
    header_timeout: Annotated[float | None, typer.Option(min=0.001, help="Seconds a connection has to send a "
                                                         "request's headers before it is closed (default "
                                                         "UPSCALE_HEADER_TIMEOUT_S, 10).")] = None,
    keep_alive: Annotated[int | None, typer.Option(min=1, help="Seconds an idle kept-alive connection stays open "
                                                   "(default UPSCALE_KEEP_ALIVE_S, 5).")] = None,
    backlog: Annotated[int | None, typer.Option(min=1, help="Connections the kernel queues before they are accepted "
                                                "(default UPSCALE_BACKLOG, 2048).")] = None,
) -> None:
    """The REST API (OpenAPI page at /docs) with the sweep scheduler, the analysis and the refit loops in the same
    process: a sweep that finishes is analysed by itself (UPSCALE_ANALYSIS_POLICY=off: only on request).
    Ctrl-C / SIGTERM shut down gracefully: running segments are released and their sweep resumes on restart.
    Connections are bounded (a limit, a deadline for request headers), so a flood of them cannot starve the
    process of file descriptors."""
    from upscale.orchestrator.raylet_fate import outlive_raylet

    outlive_raylet()  # before Ray is imported: the sweep loop restarts a dead raylet instead of the server ending
    import uvicorn

    from upscale.api.app import create_app
    from upscale.api.cli.progress import BarWatch
    from upscale.api.connections import server_options
    from upscale.control.runs import start_ray
    from upscale.orchestrator.settings import get_settings

    given = {"connection_limit": connection_limit, "header_timeout_s": header_timeout, "keep_alive_s": keep_alive,
             "backlog": backlog}
    settings = get_settings().model_copy(update={k: v for k, v in given.items() if v is not None})
    # What it starts, on stderr, before each slow step: Ray alone can take tens of seconds to say anything.
    say(f"store {without_password(settings.db_url)}; MLflow {without_password(settings.mlflow_tracking_uri)}")
    if not no_scheduler:
        start_ray(settings, BarWatch())  # from the main thread: Ray installs signal handlers
    say("opening the store (migrating it if need be)" + ("" if no_scheduler else
                                                        " and starting the sweep, analysis and refit loops"))
    app = create_app(settings, scheduler=not no_scheduler, refit_tick_s=refit_tick_s)
    say(f"starting the API on http://{host}:{port} (OpenAPI page at /docs); Ctrl-C stops it")
    uvicorn.run(app, host=host, port=port, **server_options(settings))


def say(message: str) -> None:
    """One line of what `upscale serve` is doing, on stderr: stdout and the access log stay the server's."""
    err_console.print(f"upscale serve: {message}", highlight=False, soft_wrap=True)


def without_password(url: str) -> str:
    """``url`` safe to print: a password in it (a PostgreSQL URL's, an MLflow server's) shown as ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def scheduler_command(
    refit_tick_s: Annotated[float, typer.Option(help="How often refit schedules are checked (s).")] = 5.0,
) -> None:
    """Only the background work of `upscale serve`: train pending sweeps, analyse sweeps that settle with new
    observations (UPSCALE_ANALYSIS_POLICY) and fire refit schedules, until Ctrl-C."""
    from upscale.orchestrator.raylet_fate import outlive_raylet

    outlive_raylet()  # before Ray is imported, as for `upscale serve`
    from upscale.api.cli.progress import BarWatch
    from upscale.control.analyses import AnalysisLoop
    from upscale.control.refits import RefitLoop
    from upscale.control.runs import start_ray
    from upscale.control.sweep_loop import SweepLoop
    from upscale.control.wiring import open_services
    from upscale.orchestrator.settings import get_settings

    services = open_services(get_settings())
    start_ray(services.settings, BarWatch())
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


def ui_command(
    launch: Annotated[bool, typer.Option("--launch", help="Run it instead of printing it.")] = False,
    port: Annotated[int, typer.Option(help="Port of the MLflow UI.")] = 5000,
) -> None:
    """The MLflow UI on this store's runs: one parent run per sweep, one child per segment, opening in MLflow's
    model-training view (api/mlflow_ui.py). It runs through this interpreter (`python -m mlflow`), so it works
    without the virtualenv activated."""
    from upscale.orchestrator.settings import get_settings

    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", get_settings().mlflow_tracking_uri,
            "--port", str(port), "--app-name", "upscale"]
    if not launch:
        print(shlex.join(argv))
        return
    if importlib.util.find_spec("mlflow") is None:
        raise CommandError(f"mlflow is not installed for {sys.executable}: pip install 'upscale[worker]'")
    os.execv(sys.executable, argv)
