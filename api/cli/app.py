"""The typer app the commands are registered on, and the entry point that turns user errors into one line.

A command's module is imported only when that command is looked up (`LazyCommands`): `upscale fit` loads the fitting
commands, not the sweep spec, the store or the server, and `--version` loads none. Command modules import heavy
packages (torch, ray, mlflow) inside their functions, so that `upscale laws` or `upscale --help` start instantly.

What a user can cause never shows a traceback: its error types (USER_ERRORS, PACKAGE_ERRORS: a bad spec, an unknown
law, the REST client's ApiError for a refused connection, a timeout or a 401...) and any OSError that names a file (a
missing spec, a folder where a file belongs, an unwritable output path) print one `error:` line and exit 2.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Iterator, MutableMapping
from importlib import import_module
from typing import Annotated, Any

import rich.console
import typer
from rich.measure import Measurement
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from upscale.client import ApiError
from upscale.home import private_state
from upscale.orchestrator import verbosity

# name -> (module of upscale.api.cli, attribute: a command function or a sub-app, help panel, options to
# `app.command`), in the order `upscale --help` lists them; api/cli/__init__.py's table fills it.
LAZY_COMMANDS: dict[str, tuple[str, str, str, dict[str, Any]]] = {}


def build_command(name: str) -> TyperCommand | TyperGroup:
    """The command of LAZY_COMMANDS[name], its module imported now, built as `app.command` or `app.add_typer`
    would build it (a Typer of the same defaults)."""
    module, attribute, panel, options = LAZY_COMMANDS[name]
    command = getattr(import_module(f"upscale.api.cli.{module}"), attribute)
    one = typer.Typer()
    if isinstance(command, typer.Typer):
        one.add_typer(command, name=name, rich_help_panel=panel, **options)
    else:
        one.command(name, rich_help_panel=panel, **options)(command)
    return typer.main.get_group(one).commands[name]


class _Commands(MutableMapping):
    """The root group's commands by name: every name of LAZY_COMMANDS is listed, and built on first lookup."""

    def __init__(self, built: dict[str, TyperCommand | TyperGroup]) -> None:
        self.built = built

    def __getitem__(self, name: str) -> TyperCommand | TyperGroup:
        if name not in self.built and name in LAZY_COMMANDS:
            self.built[name] = build_command(name)
        return self.built[name]

    def __setitem__(self, name: str, command: TyperCommand | TyperGroup) -> None:
        self.built[name] = command

    def __delitem__(self, name: str) -> None:
        del self.built[name]

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(LAZY_COMMANDS), **dict.fromkeys(self.built)})

    def __len__(self) -> int:
        return len(set(LAZY_COMMANDS) | set(self.built))


class LazyCommands(TyperGroup):
    """The root group: its commands come from LAZY_COMMANDS, each module imported when its command is looked up
    (to run it, or to list it in `upscale --help`); completion and suggestions read only the names."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _Commands(self.commands)


app = typer.Typer(
    cls=LazyCommands,
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


# Exceptions a user can cause (bad CSV, unknown law, bad spec...); `main` prints them as one line and exits 2 instead
# of showing a traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (ApiError, CommandError)
# The packages' user errors (docs/conventions.md, "Errors") by module and name: looked up when an exception is caught,
# since a command that never imported a module cannot raise its error, so no command imports them for this.
PACKAGE_ERRORS = (("upscale.sweeps.errors", "SpecError"), ("upscale.fitting.errors", "FitError"),
                  ("upscale.workers.errors", "WorkerError"), ("upscale.orchestrator.errors", "OrchestratorError"),
                  ("upscale.storage", "StorageError"))

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


def user_errors() -> tuple[type[BaseException], ...]:
    """USER_ERRORS and the PACKAGE_ERRORS of the modules this process has loaded."""
    loaded = (getattr(sys.modules[module], name) for module, name in PACKAGE_ERRORS if module in sys.modules)
    return (*USER_ERRORS, *loaded)


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
    except user_errors() as e:
        _fail(str(e))
    except OSError as e:
        if e.filename is None:  # not about a path the user gave: a bug, or the environment; keep the traceback
            raise
        _fail(path_error_message(e))
