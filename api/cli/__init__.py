"""The `upscale` command line: one typer app (app.py); each module below registers one area's commands."""

from api.cli import fit_commands, model_commands  # noqa: F401  (imported for their @app.command side effects)
from api.cli.app import app, main

__all__ = ["app", "main"]
