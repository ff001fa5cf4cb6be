"""Where generated state lives by default: `UPSCALE_HOME`, else ./.upscale.

The one place that default is written. The settings object (orchestrator/settings.py) reads the variable through
pydantic-settings; code that runs without it (a worker's token cache, the staging root for checkpoint URIs) calls
`upscale_home()`.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = Path(".upscale")


def upscale_home() -> Path:
    """`UPSCALE_HOME` from the environment, else ./.upscale."""
    return Path(os.environ.get("UPSCALE_HOME", DEFAULT_HOME))
