"""upscale: should a trained dense LM be upcycled into a Mixture-of-Experts, or the MoE trained from scratch?

The packages live under this one namespace: ``upscale.sweeps`` (specs and the planner), ``upscale.workers``
(training segments), ``upscale.orchestrator`` (store, scheduler, MLflow), ``upscale.fitting`` (laws, fits, D*) and
``upscale.api`` (REST service and CLI).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("upscale")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
