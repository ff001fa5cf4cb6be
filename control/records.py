"""The control layer's tables (sweep owners, fits, analyses, refit schedules, refit records, the prediction ledger) and
the API's bearer tokens, on the orchestrator's declarative Base, so there is one schema and one Alembic history
(orchestrator/migrations: 0002 creates most of them, 0005 the analyses, 0009 the predictions).

Fits and refit records are immutable once written: a refit is a new row with the next `version`, its inputs' hash
and its diff from the previous version, never an update. An analysis row is written once its claim is made
(status running) and completed once (done or failed); one row per (sweeps, inputs), so two triggers for the same
inputs make one analysis (control/analyses.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from upscale.orchestrator.clock import utcnow
from upscale.orchestrator.records import Base


class TokenRecord(Base):
    """A bearer token: only its sha256 is stored; `scope` is read or write (write implies read)."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scope: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(doc="Refused from then on; None: never expires.")
    revoked_at: Mapped[datetime | None] = mapped_column(doc="Refused from then on (`upscale token revoke`).")


class SweepOwnerRecord(Base):
    """Who submitted a sweep (a token's name), and the sweep it extends, if any."""

    __tablename__ = "sweep_owners"

    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200))
    extends: Mapped[str | None] = mapped_column(String(32))


class FitRecord(Base):
    """One fit of one law on a selection of observations: the request, the `upscale fit --json` report, plots."""

    __tablename__ = "fits"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    law: Mapped[str] = mapped_column(String(32), index=True)
    kind: Mapped[str] = mapped_column(String(16), index=True, doc="dense | upcycled | scratch: what the rows are.")
    request: Mapped[dict[str, Any]] = mapped_column()
    report: Mapped[dict[str, Any]] = mapped_column()
    data_hash: Mapped[str] = mapped_column(String(64))
    plots: Mapped[list[str]] = mapped_column(doc="Plot names, served at /fits/{id}/plots/{name}.png.")
    owner: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AnalysisRecord(Base):
    """One run of the paper's analysis (fitting/analysis.py) on the observations of a set of sweeps: its parameters,
    the versioned record (`Analysis.to_json()`) and its plots under <home>/analyses/<id>/."""

    __tablename__ = "analyses"
    __table_args__ = (UniqueConstraint("sweep_key", "inputs_hash"),)

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    sweep_ids: Mapped[list[str]] = mapped_column(doc="The sweeps analysed together, sorted.")
    sweep_key: Mapped[str] = mapped_column(String(400), index=True, doc="The sorted sweep ids joined by ','.")
    inputs_hash: Mapped[str] = mapped_column(String(64), doc="sha256 of the observation tables and the parameters.")
    observations_hash: Mapped[str] = mapped_column(String(64), doc="sha256 of the observation tables alone: the "
                                                   "automatic analyses run when it changes.")
    status: Mapped[str] = mapped_column(String(16), doc="running | done | failed")
    error: Mapped[str | None] = mapped_column(Text)
    trigger: Mapped[str] = mapped_column(String(16), doc="completed | observations | request | refit | demo")
    params: Mapped[dict[str, Any]] = mapped_column(doc="n1s, bootstrap, seed (and decisions, if asked).")
    record: Mapped[dict[str, Any] | None] = mapped_column(JSON, doc="Analysis.to_json() once done.")
    plots: Mapped[list[str]] = mapped_column(doc="Plot names: <home>/analyses/<id>/<name>.png and .pdf.")
    owner: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow, doc="When this run was claimed.")
    finished_at: Mapped[datetime | None] = mapped_column()
    runner: Mapped[str | None] = mapped_column(String(200), doc="The process running it (host:pid:nonce) while "
                                               "running: a row whose runner is gone was interrupted.")
    # Not a column: on the record run_analysis returns, True when that call ran the analysis, False when it found it.
    ran = False


class RefitScheduleRecord(Base):
    """When to refit (a 5-field cron expression, or whenever a sweep's observations change) and what to fit."""

    __tablename__ = "refit_schedules"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    trigger: Mapped[str] = mapped_column(String(32), doc="cron | on_new_observations")
    cron: Mapped[str | None] = mapped_column(String(100))
    request: Mapped[dict[str, Any]] = mapped_column(doc="RefitRequest as JSON.")
    owner: Mapped[str] = mapped_column(String(200))
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    last_error: Mapped[str | None] = mapped_column(String(2000))
    last_checked_hash: Mapped[str | None] = mapped_column(String(64), doc="Inputs last tried (failed ones too).")
    last_fired_minute: Mapped[datetime | None] = mapped_column(doc="cron: the minute a refit loop last claimed.")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class RefitRecord(Base):
    """One version of a schedule's refit: the analysis it ran, D*, and what changed since the previous version."""

    __tablename__ = "refits"
    __table_args__ = (UniqueConstraint("schedule_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    schedule_id: Mapped[str] = mapped_column(ForeignKey("refit_schedules.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    inputs_hash: Mapped[str] = mapped_column(String(64))
    dstar: Mapped[float | None] = mapped_column(Float)
    dstar_ci: Mapped[list[float] | None] = mapped_column(JSON, doc="D*'s 95% interval, null ends open: for "
                                                         "left_interval")
    dstar_answer: Mapped[dict[str, Any] | None] = mapped_column(JSON, doc="The analysis's D* at n1 (state, "
                                                                "intervals, extrapolation, health).")
    diff: Mapped[dict[str, Any]] = mapped_column(doc="Parameter and D* changes from the previous version.")
    left_interval: Mapped[bool] = mapped_column(Boolean, default=False,
                                                doc="D* is outside the previous version's interval.")
    analysis_id: Mapped[str] = mapped_column(String(16), doc="The analysis this version ran.")
    dstar_group: Mapped[str | None] = mapped_column(String(200), doc="The upcycling group `dstar` is of.")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Not a column: on the record run_refit returns, True when that call recorded it, False when it is the latest
    # version again (the inputs had not changed since).
    new = False


class PredictionRecord(Base):
    """The prediction ledger (control/ledger.py): what the newest analysis predicted for an observation before
    its segment trained, with nominal 80% and 95% intervals, and the loss it then had (`observed`, once scored)."""

    __tablename__ = "predictions"
    __table_args__ = (UniqueConstraint("sweep_id", "segment_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True,
                                          doc="The sweep whose scheduler trained the segment.")
    segment_key: Mapped[str] = mapped_column(ForeignKey("segments.key"), index=True)
    analysis_id: Mapped[str] = mapped_column(String(16), doc="The analysis the prediction came from.")
    law: Mapped[str] = mapped_column(String(200), doc="The fit that predicted it: from-scratch, upcycled <group>.")
    predicted: Mapped[float] = mapped_column(Float, doc="The fitted law's loss at the observation's coordinates.")
    sigma_fit: Mapped[float] = mapped_column(Float, doc="Spread of log loss over the fit's bootstrap refits.")
    sigma_noise: Mapped[float] = mapped_column(Float, doc="Observation noise in log loss the fit estimates.")
    lo80: Mapped[float] = mapped_column(Float)
    hi80: Mapped[float] = mapped_column(Float)
    lo95: Mapped[float] = mapped_column(Float)
    hi95: Mapped[float] = mapped_column(Float)
    observed: Mapped[float | None] = mapped_column(Float, doc="The segment's validation loss, once it finished.")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    scored_at: Mapped[datetime | None] = mapped_column()
