"""What the routes, the CLI and the background loops share: the settings, the orchestrator's store (opened with the
prediction ledger's hooks), whether auth is enforced, and the threads requested analyses run on.

A plain container: control/wiring.py `open_services(settings)` opens one, wiring the ledger's hooks into the store
from outside, and migrates the database (the orchestrator's and the control layer's tables, one Alembic history).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from upscale.control.analysis_jobs import AnalysisJobs
from upscale.control.detail_cache import DetailCache
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.store import Store

LOCAL_OWNER = "local"  # the owner of what in-process CLI calls create (they hold the database itself)


@dataclass
class Services:
    orch: Orchestrator
    auth: bool = True  # False for the CLI's in-process calls: whoever holds the database needs no token
    detail_cache: DetailCache = field(default_factory=lambda: DetailCache(0))  # GET /sweeps/{id}'s built answers
    jobs: AnalysisJobs = field(default_factory=AnalysisJobs)  # requested analyses, off the request threads

    @property
    def store(self) -> Store:
        return self.orch.store

    @property
    def settings(self) -> Settings:
        return self.orch.settings
