"""The typer app every command module registers on, and the entry point that turns user errors into one line.

Command modules import heavy packages (torch, ray, mlflow) inside their functions, so that
`upscale laws` or `upscale --help` start instantly.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.text import Text

app = typer.Typer(
    name="upscale",
    help="Upcycle a dense LM into an MoE, or train the MoE from scratch? Runs the grid, fits the laws, reports D*.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
console = Console()
err_console = Console(stderr=True)

# Exceptions a user can cause (bad CSV, unknown law, bad spec...). Each area registers its own
# types; `main` prints them as one line and exits 2 instead of showing a traceback.
USER_ERRORS: list[type[BaseException]] = []


def register_user_error(*types: type[BaseException]) -> None:
    for t in types:
        if t not in USER_ERRORS:
            USER_ERRORS.append(t)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except tuple(USER_ERRORS) as e:
        err_console.print(Text.assemble(("error: ", "bold red"), str(e)), soft_wrap=True)  # Text: no markup parsing
        sys.exit(2)
