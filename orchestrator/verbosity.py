"""How much the embedded Ray, DeepSpeed and MLflow say: quiet unless asked (`upscale -v`).

Quiet means: no Ray banners and no forwarding of Ray workers' logs to the driver, DeepSpeed only at ERROR, MLflow
and alembic only at WARNING, no Python warnings; so a command's output is its results. The choice is made once per
process (`configure`, the CLI's root callback) and travels in the environment (UPSCALE_VERBOSE, MLFLOW_LOGGING_LEVEL,
PYTHONWARNINGS), so the Ray processes started afterwards inherit it; `ensure_ray` reads it for `ray.init`. Without
`configure` (the library in a notebook), Ray is quiet and the rest keeps its own defaults.
"""

from __future__ import annotations

import logging
import os
import warnings

VERBOSE_ENV = "UPSCALE_VERBOSE"
# What a quiet process sets in its environment (a value the user set is kept); Ray's workers inherit it.
QUIET_ENV = {"MLFLOW_LOGGING_LEVEL": "WARNING", "PYTHONWARNINGS": "ignore"}


class _ErrorsOnly(logging.Filter):
    """DeepSpeed (re)sets its logger's level when imported, but keeps the logger's filters: quiet it with one."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


_DEEPSPEED_QUIET = _ErrorsOnly()


def is_verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def ray_logging_level() -> int:
    """The level of the driver's "ray" logger for `ray.init`: INFO (Ray's default) when verbose, else ERROR, which
    also drops its start-up warnings (token authentication, ...)."""
    return logging.INFO if is_verbose() else logging.ERROR


def configure(verbose: bool) -> None:
    """Quiet (or not) the third-party libraries for this process and the processes it starts."""
    os.environ[VERBOSE_ENV] = "1" if verbose else "0"
    deepspeed = logging.getLogger("DeepSpeed")
    if verbose:
        deepspeed.removeFilter(_DEEPSPEED_QUIET)
        return
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    deepspeed.addFilter(_DEEPSPEED_QUIET)
    for name in ("mlflow", "alembic"):  # MLflow sets both from MLFLOW_LOGGING_LEVEL when imported; this if it was
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.simplefilter("ignore")
