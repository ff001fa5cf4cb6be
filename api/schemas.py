"""Request and response bodies of the REST API, one model per direction (docs/conventions.md, "Names"); their field
descriptions are the OpenAPI page's documentation."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Kind = Literal["dense", "upcycled", "scratch"]


class PlanSummary(BaseModel):
    segments: int = Field(description="Segments the sweep needs (shared ones included).")
    new_segments: int = Field(description="Segments not yet done in the store: only these will train.")
    by_kind: dict[str, int] = Field(description="Segment count per kind (dense_trunk, moe_decay, ...).")
    observations: int = Field(description="Observations the sweep will produce.")
    total_flops: float = Field(description="Training FLOPs of the plan (with WSD reuse).")
    independent_flops: float = Field(description="FLOPs of the same grid as independent runs.")
    saving: float = Field(description="independent_flops / total_flops.")
    notes: list[str] = Field(description="How budgets were rounded to whole steps.")


class SweepCreated(BaseModel):
    id: str = Field(description="Sweep id: GET /sweeps/{id}.")
    name: str
    status: str
    owner: str
    plan: PlanSummary
    existing: bool = Field(False, description="True: the caller already had a sweep of this identical spec, and this "
                           "is it (HTTP 200; queued again if it had failed or been cancelled); `new=true` forces a new "
                           "one.")


class SweepSummary(BaseModel):
    id: str
    name: str
    status: str = Field(description="pending | running | done | failed | cancelling | cancelled")
    owner: str | None = Field(description="Name of the token that submitted it.")
    segments_done: int
    segments_total: int
    created_at: datetime


class SegmentProgress(BaseModel):
    key: str = Field(description="Content id of the segment (shared across sweeps).")
    kind: str
    status: str = Field(description="pending | running | done | failed")
    attempts: int
    tokens: int
    flops: float
    axes: dict[str, Any] = Field(description="This sweep's grid coordinates of the segment.")
    val_loss: float | None = Field(description="Final validation loss, once done (decays).")
    error: str | None


class SweepDetail(SweepSummary):
    error: str | None
    mlflow_run_id: str | None = Field(description="The sweep's parent run in MLflow.")
    by_status: dict[str, int] = Field(description="Segment count per status.")
    flops_done: float = Field(description="FLOPs of the segments done so far.")
    flops_planned: float = Field(description="FLOPs of all the sweep's segments.")
    segments: list[SegmentProgress]


class SweepExtend(BaseModel):
    """Grid points to add: spec sections whose lists are unioned with the sweep's."""

    additions: dict[str, Any] = Field(description="Partial spec; lists are unioned, scalars replaced.",
                                      examples=[{"tokens": {"d2": [1024]}}])


class FitCreate(BaseModel):
    """Fit one law on observations: of sweeps (filtered by kind) or given inline as rows."""

    # A whole body: the one Swagger UI would build from the fields gives both sources, which the validator refuses.
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"law": "data-mul", "kind": "upcycled", "sweep_ids": ["3f9c2a1b7d04"], "bootstrap": 100}]})

    law: str = Field(description="A law of `upscale laws` (GET /laws is not needed: errors list them).",
                     examples=["data-mul"])
    kind: Kind = Field(description="Which observations: dense, upcycled or scratch (also labels inline rows).")
    sweep_ids: list[str] = Field(default_factory=list, description="Sweeps whose observations of `kind` to fit.")
    rows: list[dict[str, float | str | None]] | None = Field(
        None, description="Inline table instead of sweeps: the law's columns, `loss`, optional `trunk`.")
    fixed: dict[str, float] = Field(default_factory=dict, description="Parameters held fixed, e.g. {\"E\": 1.7}.")
    bootstrap: int = Field(0, ge=0, le=500, description="Bootstrap refits over trunks (0: no intervals).")

    @model_validator(mode="after")
    def _one_source(self) -> FitCreate:
        if bool(self.sweep_ids) == (self.rows is not None):
            raise ValueError("give either sweep_ids or rows")
        return self


class FitPublic(BaseModel):
    id: str
    law: str
    kind: str
    owner: str
    created_at: datetime
    data_hash: str = Field(description="sha256 of the fitted columns: identifies the data.")
    request: dict[str, Any]
    report: dict[str, Any] = Field(description="The `upscale fit --json` report: params, ci, loo_rms, record...")
    plots: dict[str, str] = Field(description="Plot name -> URL of its PNG.")


class DecisionPublic(BaseModel):
    verdict: Literal["upcycle", "scratch"]
    n1: float
    d1: float
    d2: float
    loss_upcycled: float
    catch_up_tokens: float | None = Field(description="Tokens from scratch needs to match the upcycled loss.")
    tokens_saved: float | None
    probability_upcycle: float | None = Field(description="Share of bootstrap pairs voting upcycle.")
    catch_up_ci: list[float | None] | None
    dstar: float | None = Field(description="D*: upcycled tokens from which from-scratch wins (at this N1).")
    dstar_ci: list[float | None] | None
    fits: dict[str, str] = Field(description="The fits used: {moe, upcycled} -> fit id.")


class RefitRequest(BaseModel):
    """What each refit fits: one law per kind on the sweeps' observations; D* when scratch and upcycled are both fit."""

    sweep_ids: list[str] = Field(min_length=1)
    laws: dict[Kind, str] = Field(description="kind -> law, e.g. {\"scratch\": \"chinchilla\", "
                                              "\"upcycled\": \"joint\"}.", min_length=1)
    fixed: dict[str, float] = Field(default_factory=dict)
    bootstrap: int = Field(0, ge=0, le=500)
    n1: float = Field(1e9, gt=0, description="Dense size at which D* is reported.")


class RefitScheduleCreate(BaseModel):
    name: str = Field(max_length=200)
    trigger: Literal["cron", "on_new_observations"]
    cron: str | None = Field(None, description="5-field cron (minute hour day month weekday) for trigger=cron.",
                             examples=["*/15 * * * *"])
    request: RefitRequest

    @model_validator(mode="after")
    def _cron(self) -> RefitScheduleCreate:
        from upscale.api.cron import check_cron

        if (self.trigger == "cron") != (self.cron is not None):
            raise ValueError("give cron exactly when trigger is 'cron'")
        if self.cron is not None:
            check_cron(self.cron)
        return self


class RefitSchedulePublic(BaseModel):
    id: str
    name: str
    trigger: str
    cron: str | None
    request: dict[str, Any]
    owner: str
    active: bool
    last_error: str | None
    created_at: datetime


class RefitPublic(BaseModel):
    schedule_id: str
    version: int = Field(description="1, 2, ...: a refit never overwrites an earlier one.")
    inputs_hash: str = Field(description="sha256 of the request and the observation table it fitted.")
    fits: dict[str, str] = Field(description="kind -> fit id.")
    dstar: float | None
    dstar_ci: list[float | None] | None
    diff: dict[str, Any] = Field(description="Changes from the previous version: per kind per parameter, and D*.")
    left_interval: bool = Field(description="D* left the previous version's interval.")
    created_at: datetime


class Health(BaseModel):
    status: Literal["ok"]
    scheduler: bool = Field(description="Whether this process runs the sweep and refit schedulers.")
