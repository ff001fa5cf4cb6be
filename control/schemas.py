"""The requests the control layer takes and the results it returns, one model per direction (docs/conventions.md,
"Names"): the REST API's bodies and what the CLI prints as JSON, so their field descriptions are the OpenAPI page's
documentation. Bodies only HTTP has (health, tokens) are the face's own (api/schemas.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from upscale.control.cron import check_cron
from upscale.orchestrator.clock import as_utc

Kind = Literal["dense", "upcycled", "scratch"]
# Every timestamp the API returns: timezone-aware UTC, so every route writes one ISO form ("2026-01-31T12:00:00.5Z");
# SQLite gives stored timestamps back naive, PostgreSQL aware.
Timestamp = Annotated[datetime, AfterValidator(as_utc)]
DEFAULT_ANALYSIS_BOOTSTRAP = 100  # an analysis's refits per fit unless asked: intervals and a probability
MAX_BOOTSTRAP = 500  # what a request may ask for: each refit is a full fit of every law


class KindTotals(BaseModel):
    count: int = Field(description="Segments of this kind.")
    tokens: int = Field(description="Tokens they train.")
    flops: float = Field(description="Training FLOPs they cost.")
    seconds: float = Field(description="Their estimated wall time, one at a time (`estimate.basis`).")


class PlanEstimate(BaseModel):
    """How long what the plan would train takes: a planning aid, not a promise (docs/architecture.md, "Measured
    facts"); segments already done in the store take no time."""

    basis: str = Field(description="The throughput the estimate assumes.")
    serial_s: float = Field(description="Seconds with one segment at a time.")
    critical_path_s: float = Field(description="Seconds along the longest chain of dependent segments: every ready "
                                   "segment at once.")
    gpu_hours_at_400_tflops: float = Field(description="GPU-hours of what would train at 400 TFLOP/s per GPU (the "
                                           "paper's assumption).")


class SizeMemoryPublic(BaseModel):
    """One size's largest model as one worker trains it (sweeps/memory.py `memory_plan`; docs/training.md)."""

    size: str
    model: str = Field(description="The size's model that needs the most memory: `dense 0.1B` or `0.1B as 8x2`.")
    sequences_per_step: int = Field(description="Sequences one worker takes per optimiser step.")
    micro_batch_size: int | None = Field(None, description="Sequences per forward pass: the spec's, else the largest "
                                               "that fits; None when not even one fits.")
    accumulation_steps: int | None = Field(None, description="Micro-batches per optimiser step.")
    memory_gib: float = Field(description="Estimated GiB one worker holds at that micro-batch.")
    state_gib: float = Field(description="Of which weights, gradients and AdamW state.")
    device_gib: float | None = Field(None, description="GiB of the device it must fit (one GPU, or the largest node); "
                                           "None when not known (a CPU sweep planned offline).")
    fits: bool


class LawCheckPublic(BaseModel):
    """One law of the analysis on the planned grid (fitting/identifiability.py)."""

    law: str = Field(description="A law of the registry, or D*.")
    fit: str = Field(description="The observations it is fitted on.")
    identifiable: bool
    reason: str = Field(description="Why it is, or is not, identifiable on this grid.")
    add: str = Field(description="What to add to the spec; empty when identifiable.")
    unidentified: list[str] = Field(description="Parameters the grid leaves free.")


class PlanSummary(BaseModel):
    """The one summary of a plan: `upscale plan`, `upscale submit` and POST /sweeps show it (control/plans.py)."""

    name: str = Field(description="The sweep's name.")
    segments: int = Field(description="Segments the sweep needs (shared ones included).")
    new_segments: int = Field(description="Segments not yet done in the store: only these will train.")
    by_kind: dict[str, KindTotals] = Field(description="Per segment kind (dense_trunk, moe_decay, ...): count, "
                                           "tokens, FLOPs, estimated seconds.")
    observations: int = Field(description="Observations the sweep will produce.")
    tokens: int = Field(description="Tokens of the whole plan.")
    new_tokens: int = Field(description="Tokens of the segments that will train (`new_segments`).")
    total_flops: float = Field(description="Training FLOPs of the plan (with WSD reuse).")
    new_flops: float = Field(description="FLOPs of the segments that will train.")
    independent_flops: float = Field(description="FLOPs of the same grid as independent runs.")
    saving: float = Field(description="independent_flops / total_flops.")
    estimate: PlanEstimate
    memory: list[SizeMemoryPublic] = Field(description="Per size, the memory one worker (one GPU) needs for its "
                                           "largest model and the micro-batch it trains with.")
    identifiability: list[LawCheckPublic] = Field(description="Each law of the analysis on the planned grid: a law "
                                                  "that is not identifiable says why and what to add.")
    notes: list[str] = Field(description="How budgets were rounded to whole steps.")
    stale_segments: dict[str, str] = Field(description="Planned segment key -> a done segment of the same job trained "
                                           "under an older training-semantics version: retrained, unless the sweep "
                                           "reuses them (`reuse_stale`).")
    reuse_stale: bool = Field(description="Stale segments count as done (taken over, not retrained).")
    other_cut_segments: int = Field(description="Segments the store holds under another cut of their trunk's chain "
                                    "(a grid that grew by a budget between two old ones): the same computation, "
                                    "taken over, not trained.")


class SweepCreated(BaseModel):
    id: str = Field(description="Sweep id: GET /sweeps/{id}.")
    name: str
    status: str
    owner: str
    plan: PlanSummary
    existing: bool = Field(False, description="True: the caller already had a sweep of this identical spec, and this "
                           "is it (HTTP 200; queued again if it had failed or been cancelled); `new=true` forces a new "
                           "one.")
    reuse_stale: bool = Field(False, description="The sweep takes over the results of `plan.stale_segments` instead of "
                              "retraining them (`reuse_stale=true`).")


class SweepSummary(BaseModel):
    id: str
    name: str
    status: str = Field(description="pending | running | done | failed | cancelling | cancelled")
    owner: str | None = Field(description="Name of the token that submitted it.")
    segments_done: int
    segments_total: int
    created_at: Timestamp


class SegmentProgress(BaseModel):
    key: str = Field(description="Content id of the segment (shared across sweeps).")
    kind: str
    status: str = Field(description="pending | running | done | failed")
    attempts: int
    tokens: int
    flops: float
    axes: dict[str, Any] = Field(description="This sweep's grid coordinates of the segment.")
    # nullable fields default to None: FastAPI drops the nulls from the OpenAPI page's examples
    val_loss: float | None = Field(None, description="Final validation loss, once done (decays).")
    error: str | None = None
    reused_from: str | None = Field(None, description="The stale segment (older training-semantics version) whose "
                                    "result it was recorded done with.")


class SegmentsInvalidated(BaseModel):
    key: str = Field(description="The segment asked for.")
    segments: list[str] = Field(description="It and every segment trained from it: pending again, their results, "
                                "observations and checkpoints dropped.")
    sweeps: list[str] = Field(description="The sweeps holding them; those that had ended done or failed are pending "
                              "again, so the scheduler retrains them.")
    by: str = Field(description="Who invalidated them (recorded as an `invalidated` attempt on each).")


class SweepTiming(BaseModel):
    """How far the sweep has got in time, counting only what it trains: segments that were already done when it was
    recorded (shared with earlier sweeps, or taken over) are neither work done nor work left (control/timing.py)."""

    segments_to_train: int = Field(description="Segments it trains: not done when it was recorded, or trained since.")
    segments_trained: int = Field(description="Of those, the ones done.")
    segments_reused: int = Field(description="Segments done before it was recorded: not trained for it.")
    planned_s: float = Field(description="The plan's estimate of what it trains, one segment at a time (`upscale "
                             "plan`'s; basis in `basis`).")
    basis: str = Field(description="The throughput the planned time assumes.")
    elapsed_s: float | None = Field(description="Seconds since the first of its segments started training, until "
                                    "`as_of` or its last segment's end (null: none has started).")
    time_left_s: float | None = Field(description="Seconds left at `as_of`: the planned time counted down until a "
                                      "segment finishes, then the plan's remainder at the pace measured so far "
                                      "(0 once nothing is left to train; null while only running segments remain "
                                      "and they have outrun the plan: no pace to go by yet).")
    tokens_trained: int = Field(description="Tokens its trained segments processed.")
    tokens_per_s: float | None = Field(description="tokens_trained over the seconds the workers measured training "
                                       "them: one segment's throughput (null before one finishes).")
    as_of: Timestamp = Field(description="When these figures were computed: count `time_left_s` down from it.")


class SweepDetail(SweepSummary):
    error: str | None = None
    mlflow_run_id: str | None = Field(description="The sweep's parent run in MLflow.")
    by_status: dict[str, int] = Field(description="Segment count per status.")
    flops_done: float = Field(description="FLOPs of the segments done so far.")
    flops_planned: float = Field(description="FLOPs of all the sweep's segments.")
    stale_segments: dict[str, str] = Field(description="Its segment key -> a done segment of the same job trained "
                                           "under an older training-semantics version, found when it was recorded.")
    reuse_stale: bool = Field(description="True: it took over those stale results instead of retraining them.")
    timing: SweepTiming
    segments: list[SegmentProgress]


class SweepExtend(BaseModel):
    """Grid points to add: spec sections whose lists are unioned with the sweep's."""

    # Whole bodies: Swagger UI would build `additions` as {"additionalProp1": {}}, which is no spec section. Each
    # extends POST /sweeps' examples to a grid that plans (tests/api/test_schema.py).
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"additions": {"tokens": {"d2": [983040]}}, "reuse_stale": False},
        {"additions": {"tokens": {"d1": [983040]}, "upcycling": {"methods": ["drop"], "r": [0.25]}}}]})

    additions: dict[str, Any] = Field(description="Partial spec; lists are unioned, scalars replaced.")
    reuse_stale: bool = Field(False, description="Take over segments trained under an older training-semantics "
                              "version instead of retraining them.")


MAX_INLINE_ROWS = 5000  # rows one POST /fits may carry: each costs every refit a residual
LOO_HELD_OUT = 200  # above this many rows, leave-one-out leaves out a seeded sample of this many
MAX_BOOTSTRAP_ROWS = 250_000  # bootstrap draws x rows one POST /fits may refit (a draw is a refit: see docs)


class FitCreate(BaseModel):
    """Fit one law on observations: of sweeps (filtered by kind) or given inline as rows."""

    # A whole body: the one Swagger UI would build from the fields gives both sources, which the validator refuses.
    # No infinite or NaN numbers: no observation or fixed parameter is, and the fitter's arithmetic fails on them.
    model_config = ConfigDict(allow_inf_nan=False, json_schema_extra={"examples": [
        {"law": "data-mul", "kind": "upcycled", "sweep_ids": ["3f9c2a1b7d04"], "bootstrap": 100}]})

    law: str = Field(description="A law of `upscale laws` (GET /laws is not needed: errors list them).",
                     examples=["data-mul"])
    kind: Kind = Field(description="Which observations: dense, upcycled or scratch (also labels inline rows).")
    sweep_ids: list[str] = Field(default_factory=list, description="Sweeps whose observations of `kind` to fit.")
    rows: list[dict[str, float | str | None]] | None = Field(
        None, max_length=MAX_INLINE_ROWS, description=f"Inline table instead of sweeps: the law's columns, `loss`, "
        f"optional `trunk`; at most {MAX_INLINE_ROWS} rows. Above {LOO_HELD_OUT} rows, leave-one-out leaves out a "
        f"seeded sample of {LOO_HELD_OUT} (`report.loo_sampled`).")
    fixed: dict[str, float] = Field(default_factory=dict, description="Parameters held fixed, e.g. {\"E\": 1.7}.")
    bootstrap: int = Field(0, ge=0, le=500, description=f"Bootstrap refits over trunks (0: no intervals); draws x "
                           f"rows at most {MAX_BOOTSTRAP_ROWS:,}.")

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
    created_at: Timestamp
    data_hash: str = Field(description="sha256 of the fitted columns: identifies the data.")
    request: dict[str, Any]
    report: dict[str, Any] = Field(description="The `upscale fit --json` report: params, ci, loo_rms, record...")
    plots: dict[str, str] = Field(description="Plot name -> URL of its PNG.")


class AnalysisRef(BaseModel):
    """Which analysis an answer came from."""

    id: str = Field(description="Analysis id: GET /analyses lists them.")
    sweep_ids: list[str] = Field(description="The sweeps it analysed.")
    created_at: Timestamp = Field(description="When it started.")
    finished_at: Timestamp | None = Field(description="When it finished.")
    age_s: float = Field(description="Seconds since it finished: how old the answer is.")


class Interval(BaseModel):
    """A bootstrap percentile interval. An open end lies beyond the searched range: its value is null and its
    ``*_open`` flag true (unbounded), which is not the same as a missing interval (the whole interval null)."""

    low: float | None
    high: float | None
    low_open: bool = Field(description="The low end is unbounded (below the searched range).")
    high_open: bool = Field(description="The high end is unbounded (above the searched range).")


Intervals = dict[Literal["80", "95"], Interval | None]


class Extrapolation(BaseModel):
    """How far an answer lies from what the analysis trained on."""

    n1_factor: float | None = Field(description="1 inside the trained sizes, k when k times beyond an end (null: the "
                                    "fits carry no trained range).")
    tokens_factor: float | None = Field(description="The same for the token budgets (D1, D2, and the catch-up D "
                                        "against the from-scratch budgets).")
    interval_factor: float | None = Field(None, description="D* only: how far beyond the trained budgets its 95% "
                                          "interval's far end reaches (null without an interval or when an end is "
                                          "open: see interval_open).")
    interval_open: bool = Field(False, description="D* only: its 95% interval is open at an end (unbounded).")
    factor: float = Field(description="Beyond this either way, the answer is flagged.")
    flagged: bool = Field(description="An extrapolation: more than `factor` beyond the data (for D*: it, or the far "
                          "end of its 95% interval).")
    note: str = Field(description="In words: how far, and from which trained range.")


class HealthProblem(BaseModel):
    law: str
    fit: str
    kind: str = Field(description="bound, interval, monotone, loo, refit, identifiability or fit: the analysis's "
                      "problems say what and what to add.")


class DstarAt(BaseModel):
    """D* at one N1, as the analysis gives it."""

    n1: float
    dstar: float | None = Field(description="Where the weighed law forms' stacked projections cross (from scratch "
                                "starts to win); null when the searched range holds none or the runs contradict it "
                                "(see dstar_state).")
    dstar_state: Literal["crossing", "above", "below", "observed"] = Field(
        description="crossing: D* found; above: upcycling still wins at the top of the searched range; below: from "
        "scratch wins over the whole range; observed: the projection contradicts the runs, whose bracket alone "
        "bounds D* (see intervals and answer.contradiction).")
    search_range: list[float]
    intervals: Intervals | None = Field(description="80% and 95%: the forms' bootstrap mixture and where the "
                                        "calibrated bands separate, cut to the runs' bracket.")
    interval_note: str
    extrapolation: Extrapolation
    health: Literal["ok", "unhealthy"]
    health_problems: list[HealthProblem]
    law_dstar: float | None = Field(None, description="The paper's pair of laws alone (chinchilla, joint).")
    parameter_intervals: Intervals | None = Field(None, description="The paper's pair's bootstrap intervals: "
                                                  "parameter noise only, no law-form error.")
    answer: dict[str, Any] | None = Field(None, description="What the answer rests on: the runs' bracket, each pair "
                                          "of forms' D* and weight, the band and mixture intervals, the forms' "
                                          "spread, how far it is projected and the pair of runs to add next.")


class DecisionPublic(BaseModel):
    verdict: Literal["upcycle", "scratch", "undecided"] = Field(
        description="upcycle when the catch-up budget exceeds D1 in at least `decisive` of the bootstrap pairs, "
        "scratch when in at most 1 − `decisive`, undecided between (without bootstrap: the fits' own answer).")
    n1: float
    d1: float
    d2: float
    loss_upcycled: float
    catch_up_tokens: float | None = Field(description="Tokens from scratch needs to match the upcycled loss (null "
                                          "when it never does: see catch_up_state).")
    catch_up_state: Literal["reached", "never"]
    tokens_saved: float | None
    probability_upcycle: float | None = Field(description="Share of bootstrap pairs voting upcycle (null when the "
                                              "analysis ran without bootstrap).")
    decisive: float = Field(description="The share of bootstrap pairs a side needs for a verdict.")
    catch_up_intervals: Intervals | None = Field(description="80% and 95% intervals of the catch-up budget (null "
                                                 "without bootstrap).")
    extrapolation: Extrapolation = Field(description="How far (N1, D1, D2) and the catch-up budget lie from the "
                                         "trained ranges.")
    dstar: float | None = Field(description="D*: upcycled tokens from which from-scratch wins (at this N1); null when "
                                "the searched range holds no crossing (see dstar_state).")
    dstar_state: Literal["crossing", "above", "below", "observed"] = Field(
        description="crossing: D* found (where upcycling stops winning); above: upcycling still wins at the top of "
        "the searched range (D* beyond it); below: from scratch wins over the whole range; observed: the laws "
        "contradict the runs, whose bracket alone bounds D*.")
    dstar_search_range: list[float] = Field(description="The tokens searched for crossings: 100x either side of the "
                                            "trained budgets.")
    dstar_intervals: Intervals | None
    dstar_interval_note: str = Field(description="An open end of D*'s interval, in words, with what to add.")
    dstar_extrapolation: Extrapolation
    health: Literal["ok", "unhealthy"] = Field(description="Whether the answer rests on a fit with problems.")
    health_problems: list[HealthProblem]
    dstar_answer: dict[str, Any] | None = Field(None, description="What D* at this N1 rests on (DstarAt.answer).")
    observed: dict[str, Any] | None = Field(None, description="The runs at this very (N1, D1, D2), when the grid has "
                                            "them: both losses, their log gap, the noise and which leads.")
    law_verdict: str | None = Field(None, description="What the laws said where the runs, beyond noise, said "
                                    "otherwise: the runs' answer stands in `verdict`.")
    contradiction: str | None = Field(None, description="In words, where the laws contradict the runs.")
    verdict_note: str | None = Field(None, description="Why the verdict is undecided when the laws cannot speak "
                                     "to N1 (a size term fitted to nothing).")
    group: str | None = Field(None, description="The upcycling group (method, r, n_expert x topk) whose law answered: "
                              "`group=` if given, else the one predicting the lowest loss at (N1, D1, D2).")
    analysis: AnalysisRef = Field(description="The analysis that answered.")


class ExpansionDecisionPublic(DecisionPublic):
    """An upcycling decision one step later: grow the E-expert parent (trained D1 tokens) to m·E experts and train it
    D2 more, or train the m·E MoE from scratch. The answer has upcycling's shape, so one client reads both: the
    fields named for upcycling hold the expanded model's."""

    verdict: Literal["expand", "scratch", "undecided"] = Field(
        description="expand when the catch-up budget exceeds D1 in at least `decisive` of the bootstrap pairs, "
        "scratch when in at most 1 − `decisive`, undecided between.")
    loss_upcycled: float = Field(description="The expanded model's predicted loss at (N1, D1, D2).")
    probability_upcycle: float | None = Field(description="Share of bootstrap pairs voting expand (null without "
                                              "bootstrap).")
    group: str | None = Field(None, description="The expansion study that answered, e.g. `expand 4x1 -> 8x1 "
                              "uniform`: `study=` if given, else the one predicting the lowest loss at (N1, D1, D2).")


MAX_N1S = 32  # D* sizes one analysis request may ask for
MAX_N1 = 1e18  # the largest dense size N1 an analysis or a refit may find D* at (a parameter count)


class AnalysisCreate(BaseModel):
    """What to analyse a sweep's observations with; every field has a default."""

    # JSON's Infinity is no model size; the example is a whole body (the default is an empty one)
    model_config = ConfigDict(allow_inf_nan=False, json_schema_extra={"examples": [
        {"n1s": [1e8, 1e9], "bootstrap": DEFAULT_ANALYSIS_BOOTSTRAP, "seed": 0, "curves": True}]})

    n1s: list[float] | None = Field(None, max_length=MAX_N1S, examples=[[1e8, 1e9]],
                                    description=f"Dense sizes N1 to find D* at (default: the sweep's sizes; at most "
                                    f"{MAX_N1S}: each costs a D* search per bootstrap sample).")
    bootstrap: int = Field(DEFAULT_ANALYSIS_BOOTSTRAP, ge=0, le=MAX_BOOTSTRAP,
                           description="Cluster-bootstrap refits per fit (0: no intervals and no probability; each "
                           "refit costs a full fit).")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the bootstrap's resampling.")
    curves: bool = Field(True, description="Fit the decay ends the sweep's trunk curves predict beside the observed "
                         "ones, weighted by their held-out error (docs/laws.md, \"Curves as observations\"); each D* "
                         "then says how much of its precision rests on them. False: observed decays only.")

    @model_validator(mode="after")
    def _sizes(self) -> AnalysisCreate:
        if self.n1s is not None and not all(1 <= n <= MAX_N1 for n in self.n1s):
            raise ValueError(f"n1s: every N1 must be a parameter count in [1, {MAX_N1:.0e}]")
        return self


class AnalysisPublic(BaseModel):
    id: str
    sweep_ids: list[str]
    status: Literal["running", "done", "failed"]
    trigger: str = Field(description="What ran it: completed (the sweep finished), observations (they changed), "
                         "request, refit or demo.")
    owner: str
    params: dict[str, Any] = Field(description="n1s, bootstrap, seed.")
    created_at: Timestamp
    finished_at: Timestamp | None
    error: str | None = Field(description="Why it failed.")
    analysis: dict[str, Any] | None = Field(description="The analysis record (fitting/analysis.py `Analysis.to_json`): "
                                            "version, E, the from-scratch fit, per upcycling group its fit, D* per N1 "
                                            "and verdicts, and `problems`: laws the data cannot identify, why, and "
                                            "what to add to the grid. With curves: `curves` (the predicted decays, "
                                            "marked predicted with their weights, and each family's held-out error) "
                                            "and per D* `evidence` (observed and predicted decays behind each law, "
                                            "`predicted_share` of D*'s precision, `observed_dstar`). "
                                            "`expansions`: per expert-upcycling study (label, group, points) the "
                                            "same record of its mapped tables, whose D* is D*_expand, or `missing`: "
                                            "the arm it lacks and what to add.")
    plots: dict[str, str] = Field(description="Plot name -> URL of its PNG (the PDF: the same URL ending .pdf).")


class RefitRequest(BaseModel):
    """What each refit runs: the analysis of the sweeps' observations (control/analyses.py), D* reported at `n1`.
    The analysis chooses its laws (chinchilla on dense and scratch, joint on upcycled) and fixes E itself; POST /fits
    fits any one law with any fixed parameter once."""

    # JSON's Infinity is no model size; an unknown field (a law to fit, a parameter to fix) is refused, not ignored
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    sweep_ids: list[str] = Field(min_length=1, description="The sweeps whose observations each refit analyses "
                                 "(anyone's: a refit only reads them).")
    bootstrap: int = Field(DEFAULT_ANALYSIS_BOOTSTRAP, ge=0, le=MAX_BOOTSTRAP,
                           description="Cluster-bootstrap refits per fit, as for analyses (0: no interval on D*, so "
                           "`left_interval` is never set).")
    n1: float | None = Field(None, gt=0, le=MAX_N1, description="Dense size (a parameter count) at which D* is "
                             "reported (default null: the analysis runs at every size the sweeps trained, and D* is "
                             "reported at the largest, so that the answer stays where the data are).")


# Whole bodies for Swagger UI's "Try it out": the one it would build from the fields is refused (a made-up sweep
# id aside, it sends `cron` with `on_new_observations`).
REFIT_SCHEDULE_EXAMPLES = [
    {"name": "nightly D*", "trigger": "cron", "cron": "0 3 * * *", "request": {"sweep_ids": ["3f9c2a1b7d04"]}},
    {"name": "on arrival", "trigger": "on_new_observations",
     "request": {"sweep_ids": ["3f9c2a1b7d04", "9b1e77c0a2f5"], "n1": 1.0e9, "bootstrap": 200}},
]


class RefitScheduleCreate(BaseModel):
    """When to refit (a cron, or whenever the sweeps' observations change) and what (`request`)."""

    model_config = ConfigDict(json_schema_extra={"examples": REFIT_SCHEDULE_EXAMPLES})

    name: str = Field(max_length=200, description="What the schedule is for, as `upscale refit schedule list` shows "
                      "it.")
    trigger: Literal["cron", "on_new_observations"] = Field(
        description="cron: in each minute `cron` names (UTC), recording a version only when the inputs changed; "
        "on_new_observations: whenever the sweeps' observations change.")
    cron: str | None = Field(None, description="5-field cron (minute hour day month weekday, UTC) for trigger=cron; "
                             "null otherwise.", examples=["*/15 * * * *"])
    request: RefitRequest

    @model_validator(mode="after")
    def _cron(self) -> RefitScheduleCreate:
        if (self.trigger == "cron") != (self.cron is not None):
            raise ValueError("give cron exactly when trigger is 'cron'")
        if self.cron is not None:
            check_cron(self.cron)
        return self


class RefitSchedulePublic(BaseModel):
    id: str = Field(description="Schedule id: POST /refit-schedules/{id}/run, GET /refits?schedule_id=.")
    name: str
    trigger: Literal["cron", "on_new_observations"]
    cron: str | None
    request: RefitRequest = Field(description="What each refit runs, its defaults filled in.")
    owner: str = Field(description="The token name that created it: only it (or an admin token) deletes or runs it.")
    active: bool = Field(description="False once deleted (its versions are kept).")
    # Defaults where null: FastAPI leaves nulls out of the OpenAPI document, so its examples lack them.
    last_error: str | None = Field(None, description="Why its latest refit failed; null once one succeeds.")
    created_at: Timestamp

    @field_validator("request", mode="before")
    @classmethod
    def _read_fields(cls, stored: Any) -> Any:
        """Only the fields a refit reads: a schedule stored before the analysis chose its own laws also kept `laws`
        and `fixed`, which its refits refuse (its `last_error` says so)."""
        return {k: v for k, v in stored.items() if k in RefitRequest.model_fields} if isinstance(stored, dict) \
            else stored


class RefitPublic(BaseModel):
    schedule_id: str
    version: int = Field(description="1, 2, ...: a refit never overwrites an earlier one, and a version is recorded "
                         "only when the inputs changed.")
    inputs_hash: str = Field(description="sha256 of the analysis's inputs: the observation tables and parameters.")
    analysis_id: str = Field(description="The analysis this version ran: GET /analyses lists them.")
    dstar: float | None = Field(description="D* at the schedule's n1 of the upcycling group from-scratch takes "
                                "longest to catch (the best way to upcycle there); null without both laws.")
    dstar_answer: DstarAt | None = Field(description="The analysis's whole answer at that N1: where D* lies, its "
                                         "intervals, how far from the data, the health of the fits under it (null "
                                         "for versions made before it was kept).")
    dstar_group: str | None = Field(description="The upcycling group `dstar` is of.")
    diff: dict[str, dict[str, float] | float] = Field(
        description="Changes from the previous version (empty for version 1): per law (`scratch`, `upcycled "
        "<group>`) new minus old per parameter, and `dstar`: new minus old D*.")
    left_interval: bool = Field(description="D* left the previous version's 95% interval.")
    created_at: Timestamp


class RefitRun(RefitPublic):
    """What POST /refit-schedules/{id}/run answers: the version it recorded, or the latest one again."""

    unchanged: bool = Field(description="True: the inputs are this version's, the latest; nothing new was recorded "
                            "and no analysis ran (HTTP 200). False: a new version (HTTP 201).")


class CalibrationCounts(BaseModel):
    """How a set of predictions scored: coverage of the nominal intervals and mean absolute error (loss units);
    null until one is scored."""

    predicted: int = Field(description="Predictions recorded before their segments trained.")
    scored: int = Field(description="Of those, the ones whose segment has finished.")
    coverage_80: float | None = Field(description="Share of scored observations inside their nominal 80% interval.")
    coverage_95: float | None = Field(description="Share inside their nominal 95% interval.")
    mae: float | None = Field(description="Mean |observed - predicted| loss.")


class PredictionPublic(BaseModel):
    """One entry of the ledger: what an analysis predicted for an observation, and what it then was."""

    segment: str
    law: str = Field(description="The analysis's fit that predicted it: from-scratch, or upcycled <group>.")
    analysis_id: str
    predicted: float
    interval_80: list[float]
    interval_95: list[float]
    sigma_fit: float = Field(description="sd of log loss over the fit's bootstrap refits.")
    sigma_noise: float = Field(description="The fit's observation noise in log loss (its LOO RMS, relative).")
    observed: float | None
    inside_80: bool | None
    inside_95: bool | None


class CalibrationPublic(CalibrationCounts):
    """A sweep's prediction ledger (GET /sweeps/{id}/calibration, `upscale calibration`)."""

    sweep_id: str
    by_law: dict[str, CalibrationCounts] = Field(description="The same figures per fit.")
    analyses: list[str] = Field(description="The analyses the predictions came from.")
    predictions: list[PredictionPublic]


class SuggestRequest(BaseModel):
    """What `POST /sweeps/{id}/suggest` weighs: one FLOP budget, the N1 whose D* matters, when to stop."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"budget_flops": 1e15, "n1": 1e9, "tolerance": 4, "apply": False}]})

    budget_flops: float = Field(gt=0, description="Training FLOPs the suggested extensions may cost in all "
                                "(marginal: what the store holds is free).")
    n1: float | None = Field(None, ge=1, le=1e18, description="Dense size N1 whose D* interval to shrink; default: the "
                             "analysis's largest.")
    tolerance: float | None = Field(None, gt=1, description="Stop once the expected 95% delta-method D* interval's "
                                    "hi/lo ratio is at most this (4: within a factor of 2 either way); default: "
                                    "spend the budget.")
    apply: bool = Field(False, description="Also submit the suggested extensions as a sweep (as POST "
                        "/sweeps/{id}/extend does).")
    study: str | None = Field(None, max_length=200, description="Narrow this expansion study's D*_expand instead "
                              "(its label in the analysis, e.g. `expand 4x1 -> 8x1 uniform`); default: the dense->MoE "
                              "D* of the best upcycling group.")


class SuggestedAction(BaseModel):
    rank: int = Field(description="1 = chosen first: the most D* certainty per FLOP.")
    kind: Literal["d1", "d2", "scratch", "size"] = Field(description="A new dense budget D1, a new upcycled budget "
                                                        "D2, a new from-scratch budget, a new dense size.")
    description: str
    additions: dict[str, Any] = Field(description="The partial spec this action adds (POST .../extend's).")
    marginal_flops: float = Field(description="FLOPs it trains given the store and the actions ranked before it.")
    new_observations: int = Field(description="Observations it adds that inform the D* at N1.")
    expected_interval: list[float] = Field(description="The expected 95% delta-method D* interval after it (and "
                                           "those ranked before it).")


class StopAdvice(BaseModel):
    """A trunk still training that cannot move D*: what finishing it would buy and cost."""

    trunk: str = Field(description="The trunk's key (its first piece's segment key; `upscale status` lists it).")
    pending_observations: int = Field(description="Its planned decays still to train that inform the D* at N1.")
    remaining_flops: float = Field(description="FLOPs of all its segments still to train: what stopping it saves.")
    sd_shrink: float = Field(description="The share by which those decays would shrink the sd of log D* (below "
                             "0.01: not worth their FLOPs).")


class Suggestion(BaseModel):
    """Ranked grid extensions by expected shrinkage of the D* interval per FLOP (docs/laws.md, "Active design")."""

    sweep_id: str
    analysis_id: str = Field(description="The analysis whose fits the criterion reads.")
    group: str = Field(description="The upcycling group whose D* it targets.")
    n1: float
    dstar: float
    interval: list[float | None] | None = Field(description="The analysis's 95% bootstrap interval of D* at N1 "
                                                "(null: no bootstrap; an end null: some refits never cross).")
    delta_interval: list[float] = Field(description="The 95% delta-method interval of D* at N1 now: what "
                                        "`expected_interval` and `tolerance` are measured against.")
    profile_interval: list[float | None] | None = Field(
        description="The 95% profile-likelihood interval of D* at N1 now (every D* where both laws refitted to cross "
                    "there are not rejected): follows D*'s skew and the data's real reach; an end null where the data "
                    "do not bound that side (both null: no D* searched is rejected), the whole field null when no "
                    "crossing is consistent with the data.")
    noise: dict[str, float] = Field(description="Per-point and per-trunk noise sd of log loss, from the residuals.")
    budget_flops: float
    total_flops: float = Field(description="Marginal FLOPs of all the actions together.")
    expected_interval: list[float] = Field(description="The expected 95% D* interval after all the actions.")
    stopped: Literal["tolerance", "budget", "no_gain", "limit"] = Field(
        description="Why no more actions: the interval reached the tolerance, nothing else fits the budget, no "
                    "candidate shrinks the interval, or the most actions one call chooses (4: each costs a plan of "
                    "the extended grid per candidate) were chosen; apply them and ask again for more.")
    actions: list[SuggestedAction]
    forms_disagree: dict[str, Any] | None = Field(None, description="The pair of runs the analysis's law forms "
                                                  "disagree most about inside D*'s 80% interval (upcycled at D1 = D2 "
                                                  "= `tokens`, from scratch at `tokens`, with their FLOPs): what "
                                                  "would most narrow D* across forms, beside the actions that narrow "
                                                  "it for the paper's laws.")
    additions: dict[str, Any] = Field(description="All the actions' additions merged: the extension to apply.")
    applied: SweepCreated | None = Field(None, description="The extension sweep, with `apply`.")
    stop: list[StopAdvice] = Field(default_factory=list, description="From-scratch and MoE trunks of the sweep still "
                                   "training whose planned decays would shrink the D* interval by less than 1%, "
                                   "costliest first: cancelling the sweep and resubmitting it without their budgets "
                                   "saves their remaining FLOPs.")
