"""Confine server-side paths a caller names (a spec's `data.corpus`, `data.tokenizer`, `model.dense.path`) to the data
roots the operator configured (`UPSCALE_DATA_ROOTS`): the API must not read, and copy into its store, any file the
server can see.

A path is resolved (`~` expanded, symlinks followed, `..` collapsed) before it is compared with the resolved roots,
so a symlink inside a root that points out of it is refused. Whether the path exists is never looked at: the refusal
reads the same for an existing and a missing path outside the roots, so it reveals nothing about the server's files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


class OutsideRoots(ValueError):
    """A path outside every data root (or not absolute); the message names the roots, never the path's state."""


def confine(path: str, roots: Sequence[Path], instead: str | None = "a builtin: name") -> Path:
    """``path`` resolved, if it is absolute and lies under one of ``roots``; OutsideRoots otherwise, its message
    naming what the field takes ``instead`` of a path (None: nothing else). Relative paths are refused: the server
    and its Ray workers do not share a working directory to resolve them against."""
    expanded = os.path.expanduser(path)
    if os.path.isabs(expanded):
        resolved = Path(os.path.realpath(expanded))
        for root in roots:
            real_root = Path(os.path.realpath(root))
            if resolved == real_root or real_root in resolved.parents:
                return resolved
    listed = ":".join(str(r) for r in roots) or "none configured"
    alternative = f"{instead} or " if instead else ""
    raise OutsideRoots(f"must be {alternative}an absolute path under the data roots ({listed}); the server's "
                       "UPSCALE_DATA_ROOTS sets them")
