"""The `upscale` command line: one typer app (app.py); each module below registers one area's commands."""

from api.cli import fit_commands, model_commands, plan_commands, train_commands  # noqa: F401  (register commands)
from api.cli.app import app, main

__all__ = ["app", "main"]
