"""Where generated state lives by default: `UPSCALE_HOME`, else ./.upscale, and who may read it: its owner only.

The one place that default is written. The settings object (orchestrator/settings.py) reads the variable through
pydantic-settings; code that runs without it (a worker's token cache, the staging root for checkpoint URIs) calls
`upscale_home()`. The state holds token hashes, specs and results: `private_state` makes every file the CLI (and the
server and embedded Ray it starts) creates 0600 and every folder 0700, and `private_file` creates one file so
wherever upscale is used as a library (the SQLite store: its -wal and -shm files take the database's mode).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DEFAULT_HOME = Path(".upscale")
PRIVATE_UMASK = 0o077  # files 0600, folders 0700


def upscale_home() -> Path:
    """`UPSCALE_HOME` from the environment, else ./.upscale."""
    return Path(os.environ.get("UPSCALE_HOME", DEFAULT_HOME))


def private_state() -> None:
    """New files of this process and the processes it starts are its user's only (umask 077)."""
    os.umask(PRIVATE_UMASK)


def private_file(path: Path) -> Path:
    """``path`` created empty with mode 0600 if absent, the folders made for it 0700; an existing file is never
    opened (closing a descriptor of an SQLite database drops every POSIX lock this process holds on it) and keeps
    its mode (an operator who opened it up meant to)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    return path
