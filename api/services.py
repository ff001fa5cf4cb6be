"""What the routes and the CLI share: the settings, the orchestrator's store, and whether auth is enforced.

`Services.open(settings)` migrates the database (the orchestrator's and the API's tables, one Alembic history).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import upscale.api.records  # noqa: F401  (registers the API's tables on the shared metadata)
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.store import Store


@dataclass
class Services:
    orch: Orchestrator
    auth: bool = True  # False for the CLI's in-process calls: whoever holds the database needs no token
    detail_cache: dict[str, tuple[Any, bytes, str]] = field(default_factory=dict)  # sweep -> (version, JSON, ETag)

    @classmethod
    def open(cls, settings: Settings, auth: bool = True) -> Services:
        return cls(Orchestrator.open(settings), auth)

    @property
    def store(self) -> Store:
        return self.orch.store

    @property
    def settings(self) -> Settings:
        return self.orch.settings
