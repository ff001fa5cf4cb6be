"""The typer app every command module registers on, and the entry point that turns user errors into one line.

Command modules import heavy packages (torch, ray, mlflow) inside their functions, so that
`upscale laws` or `upscale --help` start instantly.
"""

from __future__ import annotations

import sys
from typing import Annotated

import rich.console
import typer
from rich.measure import Measurement
from rich.text import Text

from upscale.orchestrator import verbosity

app = typer.Typer(
    name="upscale",
    help="Upcycle a dense LM into an MoE, or train the MoE from scratch? Runs the grid, fits the laws, reports D*.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
# How wide piped output may grow; a bound only so that a pathological line cannot make rich allocate without end.
PIPED_MAX_WIDTH = 10_000


class Console(rich.console.Console):
    """rich's console, except that piped or redirected output is printed at its natural width: rich would cut
    tables (with "…") and wrap lines at 80 columns, which breaks `upscale ... | grep` and files."""

    def print(self, *objects, **kwargs) -> None:  # type: ignore[override]
        if self.is_terminal or not objects or kwargs.get("width") is not None:
            super().print(*objects, **kwargs)
            return
        options = self.options.update(max_width=PIPED_MAX_WIDTH)
        natural = max(Measurement.get(self, options, self.render_str(o) if isinstance(o, str) else o).maximum
                      for o in objects)
        width, self.width = self.width, max(self.width, natural)
        try:
            super().print(*objects, **kwargs)
        finally:
            self.width = width


console = Console()
err_console = Console(stderr=True)


@app.callback()
def root(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show Ray's, DeepSpeed's and MLflow's own "
                                               "logs and banners (off by default).")] = False) -> None:
    verbosity.configure(verbose)


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
