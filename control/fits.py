"""Fits behind the routes: fit a law on stored observations (or inline rows), keep the report, its plots and
`report.json` under <home>/fits/<id>/. Decisions come from analyses only (control/analyses.py). The observation tables
read here are what the analyses read too.

The numerics are fitting/'s (`report`), and so are the plots (`fit_plots`, as `upscale fit --plot`).

A fit requested over the API runs on one of the server's heavy-request threads (api/heavy.py), and its cost is
bounded (docs/architecture.md, "What a request may cost"): inline rows at most MAX_INLINE_ROWS (`FitCreate`),
leave-one-out over a seeded sample of LOO_HELD_OUT rows above that many, and a bootstrap of at most 500 draws and
MAX_BOOTSTRAP_ROWS row-refits (draws x rows).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from sqlalchemy import select

from upscale.control.records import FitRecord
from upscale.control.schemas import LOO_HELD_OUT, MAX_BOOTSTRAP_ROWS, FitCreate
from upscale.fitting.errors import FitError
from upscale.fitting.laws import get_law
from upscale.fitting.summary import clean, report
from upscale.orchestrator.errors import NotFoundError, OrchestratorError
from upscale.orchestrator.observations import table
from upscale.orchestrator.records import ObservationRecord

if TYPE_CHECKING:  # at run time only its attributes are used: the CLI's reads of stored fits need no Ray or MLflow
    from upscale.control.services import Services
    from upscale.fitting.plots import DrawnPlots
    from upscale.orchestrator.store import Store

# matplotlib (its mathtext parser included) is not thread-safe: request threads and the refit loop plot in turn
PLOT_LOCK = threading.Lock()


def fit_path(home: Path, fit_id: str) -> Path:
    """Where a fit's report.json and plots live under UPSCALE_HOME."""
    return home / "fits" / fit_id


class ObservationCache:
    """Observation reads shared by one refit tick: each sweep's observations are loaded once, each (sweep, kind)
    table built once and each set of sweeps' trunk curves read once, however many schedules and kinds ask for them.
    Live for one tick only, so the next tick sees new observations and curves."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._records: dict[str, list[ObservationRecord]] = {}
        self._tables: dict[tuple[str, str], pd.DataFrame] = {}
        self._curves: dict[tuple[str, ...], Any] = {}

    def curves(self, sweep_ids: Sequence[str], read: Callable[[], Any]) -> Any:
        """The trunk curves of ``sweep_ids`` as ``read`` gives them (control/analyses.py `curve_trunks`), read once
        per tick: on a production sweep the decays' per-step LR schedules are the larger part of a tick's reads."""
        key = tuple(sweep_ids)
        if key not in self._curves:
            self._curves[key] = read()
        return self._curves[key]

    def records(self, sweep_id: str) -> list[ObservationRecord]:
        """The sweep's observation records, loaded once (the tables and the trunk curves both read them)."""
        if sweep_id not in self._records:
            self._records[sweep_id] = self.services.store.observations(sweep_id)
        return self._records[sweep_id]

    def table(self, sweep_id: str, kind: str) -> pd.DataFrame:
        """The sweep's table of ``kind``; callers get it through `observations_table`, which copies it."""
        if (sweep_id, kind) not in self._tables:
            self._tables[sweep_id, kind] = table(self.records(sweep_id), kind)
        return self._tables[sweep_id, kind]


def observations_table(services: Services, sweep_ids: list[str], kind: str,
                       cache: ObservationCache | None = None) -> pd.DataFrame:
    """The sweeps' observations of ``kind``, one row per segment even when sweeps share segments; read through
    ``cache`` when given. The result is a new frame (concat), so a caller may change it without touching the
    cache."""
    try:
        parts = [cache.table(s, kind) if cache is not None else table(services.store.observations(s), kind)
                 for s in sweep_ids]
    except NotFoundError as e:  # a sweep named in a fit's body: 422 like any bad value there, not a missing URL
        raise OrchestratorError(str(e)) from None
    df = pd.concat(parts, ignore_index=True)
    return df.drop_duplicates("segment", ignore_index=True)


def create_fit(services: Services, req: FitCreate, owner: str, cache: ObservationCache | None = None) -> FitRecord:
    """Fit, write report.json and plots, record the fit; FitError for anything the caller must fix. A plot the data
    cannot support is skipped with a warning in the report: a diagnostic never fails the fit."""
    from upscale.fitting.plots import fit_plots  # matplotlib: loaded by the first fit, not at server start

    law = get_law(req.law)
    df = (pd.DataFrame(req.rows) if req.rows is not None
          else observations_table(services, req.sweep_ids, req.kind, cache))
    if df.empty:
        raise FitError(f"no {req.kind} observations in sweep(s) {', '.join(req.sweep_ids)} yet")
    if req.bootstrap * len(df) > MAX_BOOTSTRAP_ROWS:
        raise FitError(f"bootstrap={req.bootstrap} over {len(df)} rows refits {req.bootstrap * len(df):,} rows, over "
                       f"the {MAX_BOOTSTRAP_ROWS:,} one request may: use bootstrap <= "
                       f"{MAX_BOOTSTRAP_ROWS // len(df)}, or analyse the sweep (POST /sweeps/{{id}}/analysis)")
    rep = clean(report(law, df, req.fixed, req.bootstrap, loo_held_out=LOO_HELD_OUT)[0])

    def draw(out: Path) -> DrawnPlots:
        with PLOT_LOCK:
            return fit_plots(law.name, rep, df, out)

    return store_fit(services.store, services.settings.home, req.kind, rep, req.model_dump(mode="json"), owner, draw)


def store_fit(store: Store, home: Path, kind: str, rep: dict[str, Any], request: dict[str, Any], owner: str,
              draw: Callable[[Path], DrawnPlots] | None = None) -> FitRecord:
    """Keep a fit report: `report.json` (and the plots ``draw`` writes, by name) under <home>/fits/<id>/, and its
    row in the fits table; each plot ``draw`` skipped is one more line in the report's warnings."""
    rep = clean(rep)
    fit_id = uuid.uuid4().hex[:12]
    out = fit_path(home, fit_id)
    out.mkdir(parents=True, exist_ok=True)
    plots: list[str] = []
    if draw is not None:
        drawn = draw(out)
        plots = drawn.names
        rep = {**rep, "warnings": [*rep["warnings"], *drawn.warnings()]}
    (out / "report.json").write_text(json.dumps(rep))
    record = FitRecord(id=fit_id, law=rep["law"], kind=kind, request=request, report=rep,
                       data_hash=rep["record"]["data_hash"], plots=plots, owner=owner)
    with store.transaction() as s:
        s.add(record)
    return record


def get_fit(services: Services, fit_id: str) -> FitRecord | None:
    with services.store.transaction() as s:
        return s.get(FitRecord, fit_id)


def list_fits(services: Services) -> list[FitRecord]:
    with services.store.transaction() as s:
        return list(s.scalars(select(FitRecord).order_by(FitRecord.created_at)))
