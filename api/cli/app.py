"""The typer app every command module registers on, and the entry point that turns user errors into one line.

Command modules import heavy packages (torch, ray, mlflow) inside their functions, so that
`upscale laws` or `upscale --help` start instantly.

What a user can cause never shows a traceback: the registered error types (a bad spec, an unknown law, the REST
client's ApiError for a refused connection, a timeout or a 401...) and any OSError that names a file (a missing
spec, a folder where a file belongs, an unwritable output path) print one `error:` line and exit 2. Anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import sys
from typing import Annotated

import rich.console
import typer
from rich.measure import Measurement
from rich.text import Text

from upscale.client import ApiError
from upscale.home import private_state
from upscale.orchestrator import verbosity

app = typer.Typer(
    name="upscale",
    help="Upcycle a dense LM into an MoE, or train the MoE from scratch? Runs the grid, fits the laws, reports D*.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion
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


class CommandError(RuntimeError):
    """A command's own check failed (a missing optional package, a bad combination of options)."""


# Exceptions a user can cause (bad CSV, unknown law, bad spec...). Each area registers its own
# types; `main` prints them as one line and exits 2 instead of showing a traceback.
USER_ERRORS: list[type[BaseException]] = [ApiError, CommandError]

# What to do about an OSError that names a path, by its errno.
PATH_FIXES = {
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
    errno.EISDIR: "that is a folder: give a file",
    errno.EACCES: "choose a path you may use, or change its permissions",
    errno.EPERM: "choose a path you may use, or change its permissions",
    errno.EROFS: "the filesystem is read-only: choose another path",
    errno.EEXIST: "remove it or choose another path",
    errno.ENOSPC: "the disk is full: free space or choose another path",
}


def register_user_error(*types: type[BaseException]) -> None:
    for t in types:
        if t not in USER_ERRORS:
            USER_ERRORS.append(t)


def path_error_message(e: OSError) -> str:
    """`PATH: what went wrong; what to do` for an OSError that names a file."""
    paths = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    fix = PATH_FIXES.get(e.errno)  # type: ignore[arg-type]
    return f"{paths}: {e.strerror or e}" + (f"; {fix}" if fix else "")


def _print_version(value: bool) -> None:
    if value:
        from upscale import __version__

        print(f"upscale {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show Ray's, DeepSpeed's and MLflow's own logs and "
                                          "banners (off by default).")] = False,
) -> None:
    """The options every command shares; the app's help is the Typer's."""
    verbosity.configure(verbose)


def _fail(message: str) -> None:
    err_console.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)  # Text: no markup parsing
    sys.exit(2)


def main() -> None:
    """Console-script entry point: the state it writes is private (upscale/home.py)."""
    private_state()
    try:
        app()
    except tuple(USER_ERRORS) as e:
        _fail(str(e))
    except OSError as e:
        if e.filename is None:  # not about a path the user gave: a bug, or the environment; keep the traceback
            raise
        _fail(path_error_message(e))
