"""Opening the control layer's `Services` on this deployment's store: the one place that wires what the control layer
adds to the machinery below, so that `Services` stays a plain container that imports none of it. The store is
opened with the prediction ledger's hooks (control/ledger.py): the orchestrator hears of the ledger only through
them.
"""

from __future__ import annotations

from upscale.control import ledger
from upscale.control.analysis_jobs import AnalysisJobs
from upscale.control.detail_cache import DetailCache
from upscale.control.services import Services
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import Settings


def open_services(settings: Settings, auth: bool = True) -> Services:
    """``settings``' store, migrated, with the ledger's hooks; ``auth`` False for the CLI's in-process calls."""
    return Services(Orchestrator.open(settings, ledger.hooks()), auth, DetailCache(settings.detail_cache_bytes),
                    AnalysisJobs())
