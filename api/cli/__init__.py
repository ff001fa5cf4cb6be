"""The `upscale` command line: one typer app (app.py) and the table below, which registers every command in the order
`upscale --help` lists it, under its help panel (the way litgpt's `__main__.py` lists its commands).

The modules define the commands as plain functions; none registers itself, and none is imported until its command
is looked up, so a command loads only what it uses. Commands that reach the store or a server
do it through api/cli/local.py: `connect(api, token)` gives `upscale.Client` with `--api`, else `Local`, the same
control/ calls in-process.
"""

from __future__ import annotations

from typing import Any

from upscale.api.cli.app import LAZY_COMMANDS, app, main

SWEEPS, ANALYSIS, MODELS, SERVICE = "Sweeps", "Analysis", "Models", "Service"

# (name, "module.attribute" of the command function or sub-app, panel, extra options to `app.command`), in the order
# `upscale --help` shows. A module is imported when its command is looked up (api/cli/app.py, `LazyCommands`).
COMMANDS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("demo", "demo_command.demo_command", SWEEPS, {}),
    ("plan", "plan_commands.plan_command", SWEEPS, {}),
    ("run", "run_commands.run_command", SWEEPS, {}),
    ("slurm", "slurm_commands.slurm_app", SWEEPS, {}),
    ("submit", "sweep_commands.submit_command", SWEEPS, {}),
    ("status", "sweep_commands.status_command", SWEEPS, {}),
    ("sweeps", "sweep_commands.sweeps_command", SWEEPS, {}),
    ("segments", "segment_commands.segments_app", SWEEPS, {}),
    ("observations", "sweep_commands.observations_command", SWEEPS, {}),
    ("cancel", "sweep_commands.cancel_command", SWEEPS, {}),
    ("suggest", "suggest_commands.suggest_command", SWEEPS, {}),
    ("gc", "run_commands.gc_command", SWEEPS, {}),
    ("analyze", "analyze_command.analyze_command", ANALYSIS, {}),
    ("calibration", "calibration_command.calibration_command", ANALYSIS, {}),
    ("decide", "fit_commands.decide_command", ANALYSIS, {}),
    ("dstar", "fit_commands.dstar_command", ANALYSIS, {}),
    ("refit", "refit_commands.refit_app", ANALYSIS, {}),
    ("fit", "fit_commands.fit_command", ANALYSIS, {}),
    ("compare", "fit_commands.compare_command", ANALYSIS, {}),
    ("optimal", "fit_commands.optimal_command", ANALYSIS, {}),
    ("laws", "fit_commands.laws_command", ANALYSIS, {}),
    ("model", "model_commands.model_app", MODELS, {}),
    ("upcycle", "model_commands.upcycle_command", MODELS, {}),
    ("train-segment", "train_commands.train_segment", MODELS, {}),
    ("serve", "serve_commands.serve_command", SERVICE, {}),
    ("scheduler", "serve_commands.scheduler_command", SERVICE, {}),
    ("ui", "serve_commands.ui_command", SERVICE, {}),
    ("token", "token_commands.token_app", SERVICE, {}),
]

LAZY_COMMANDS.update({name: (*where.split("."), panel, options) for name, where, panel, options in COMMANDS})

__all__ = ["COMMANDS", "app", "main"]
