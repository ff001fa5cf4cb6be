"""The `upscale` command line: one typer app (app.py); each module below registers one area's commands."""

from upscale.api.cli import (  # noqa: F401  (imported for their @app.command side effects)
    analyze_command,
    calibration_command,
    demo_command,
    fit_commands,
    model_commands,
    plan_commands,
    run_commands,
    segment_commands,
    serve_commands,
    suggest_commands,
    token_commands,
    train_commands,
)
from upscale.api.cli.app import app, main

__all__ = ["app", "main"]
