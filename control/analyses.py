"""The service's analyses: the paper's analysis (fitting/analysis.py `analyze`) run on sweeps' observations, kept in
the `analyses` table with its plots under <home>/analyses/<id>/, and the loop that runs it by itself.

One analysis per (sweeps, inputs): the inputs hash covers the observation tables and the parameters (N1s,
bootstrap, seed, the record's version), and the row is inserted before the work starts, so of two triggers for the
same inputs (a request and the loop, two loops, two requests) one runs it and the other gets its record. A `failed`
row is retried by the next explicit trigger (a request, a refit, the demo); the loop does not retry the same inputs.
A `running` row whose process died (a crash, a kill) is taken over by the next trigger once it is older than
STALE_RUNNING_S, so a crash never blocks an analysis for longer than that.

Everything that answers from an analysis reads the newest *done* one: GET /decisions/upcycle, `upscale decide`
and `upscale dstar` without fit files, GET /sweeps/{id}/analysis. Refits run `run_analysis` too (control/refits.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import traceback
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from sqlalchemy import ColumnElement, or_, select, true, update
from sqlalchemy.exc import IntegrityError

from upscale.control.fits import PLOT_LOCK, ObservationCache, observations_table
from upscale.control.records import AnalysisRecord
from upscale.control.schemas import DEFAULT_ANALYSIS_BOOTSTRAP, AnalysisPublic, DecisionPublic
from upscale.control.supervised import SupervisedLoop
from upscale.fitting.errors import FitError
from upscale.orchestrator.records import as_utc, utcnow

if TYPE_CHECKING:
    from upscale.control.services import Services
    from upscale.fitting.analysis import Analysis, Progress
    from upscale.fitting.dstar import Limits
    from upscale.fitting.plots import DrawnPlots
    from upscale.orchestrator.store import Store

log = logging.getLogger(__name__)

KINDS = ("dense", "scratch", "upcycled")  # the tables `analyze` takes
STALE_RUNNING_S = 3600.0  # a `running` row older than this is a crashed run: the next trigger takes it over
WAIT_POLL_S = 0.5  # how often a trigger that found its analysis running looks again
SETTLED = ("done", "failed", "cancelled")  # sweep states the loop analyses: nothing more is coming for now
POLICIES = ("on_new_observations", "off")


class NotReady(RuntimeError):
    """Nothing can answer yet (no observations, no analysis, the analysis cannot answer): HTTP 409, and the message
    says what is missing."""


def analysis_dir(home: Path, analysis_id: str) -> Path:
    """Where an analysis's plots live under UPSCALE_HOME."""
    return home / "analyses" / analysis_id


def sweep_key(sweep_ids: Sequence[str]) -> str:
    return ",".join(sorted(set(sweep_ids)))


def sweep_tables(services: Services, sweep_ids: Sequence[str],
                 cache: ObservationCache | None = None) -> dict[str, pd.DataFrame]:
    """The sweeps' observation tables, one per kind `analyze` reads (control/fits.py reads them)."""
    return {kind: observations_table(services, sorted(set(sweep_ids)), kind, cache) for kind in KINDS}


def observations_hash(tables: dict[str, pd.DataFrame]) -> str:
    """sha256 of the tables' rows, without their MLflow run ids (which say where a row is logged, not what it is)."""
    h = hashlib.sha256()
    for kind in KINDS:
        h.update(kind.encode())
        h.update(tables[kind].drop(columns=["mlflow_run_id"], errors="ignore").to_csv(index=False).encode())
    return h.hexdigest()


def analysis_params(n1s: Sequence[float] | None, bootstrap: int, seed: int,
                    decisions: Sequence[tuple[float, float, float]] | None = None) -> dict[str, Any]:
    """The parameters as the row keeps and hashes them."""
    return {"n1s": sorted(float(n) for n in n1s) if n1s else None, "bootstrap": int(bootstrap), "seed": int(seed),
            "decisions": [list(map(float, d)) for d in decisions] if decisions else None}


def inputs_hash(observations: str, params: dict[str, Any]) -> str:
    """sha256 of the observations' hash, the parameters and the record's version: equal inputs, one analysis."""
    from upscale.fitting.analysis import ANALYSIS_VERSION

    text = json.dumps({"observations": observations, "params": params, "version": ANALYSIS_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def run_analysis(services: Services, sweep_ids: Sequence[str], *, n1s: Sequence[float] | None = None,
                 bootstrap: int = DEFAULT_ANALYSIS_BOOTSTRAP, seed: int = 0, owner: str, trigger: str,
                 progress: Progress | None = None, tables: dict[str, pd.DataFrame] | None = None,
                 decisions: Sequence[tuple[float, float, float]] | None = None, workers: int = 1,
                 cache: ObservationCache | None = None) -> AnalysisRecord:
    """Analyse the sweeps' observations and keep the record; the existing record when these inputs were analysed
    already (``.ran`` says which). ``tables``: the sweeps' tables when the caller read them already (a refit tick),
    or data that is in no sweep (the synthetic demo, ``sweep_ids`` empty).

    NotFoundError for an unknown sweep, NotReady when the sweeps have no finished segment, FitError when there is
    nothing the analysis can fit (the row is then `failed` with that error, as for any failure)."""
    ids = sorted(set(sweep_ids))
    for sweep_id in ids:
        services.store.sweep(sweep_id)  # NotFoundError (404) before anything is read
    tables = tables if tables is not None else sweep_tables(services, ids, cache)
    if not any(len(t) for t in tables.values()):
        raise NotReady(f"sweep {', '.join(ids)} has no finished segments yet: the analysis needs the losses of "
                       f"finished decay segments; it runs by itself when they finish")
    params = analysis_params(n1s, bootstrap, seed, decisions)
    observed = observations_hash(tables)
    record, claimed = _claim(services.store, ids, inputs_hash(observed, params), observed, params, trigger, owner)
    if not claimed:
        return record
    from upscale.fitting.analysis import analyze

    try:
        analysis = analyze(tables, params["n1s"], decisions, bootstrap, seed, workers, progress,
                           sweep_limits(services, ids))
        folder = analysis_dir(services.settings.home, record.id)
        drawn = _draw(analysis, tables, folder)
        _finish(services.store, record, status="done", record={**analysis.to_json(), "plots_skipped": drawn.skipped},
                plots=drawn.names)
    except BaseException as e:  # any failure is the row's (never left `running`); FitError reaches callers as a 422
        _finish(services.store, record, status="failed", error=_one_line(e))
        raise
    _log_to_mlflow(services, record, folder)
    return record


def sweep_limits(services: Services, sweep_ids: Sequence[str]) -> Limits:
    """The laws' sane region for these sweeps' models (fitting/dstar.py `Limits`): the loss of an untrained model,
    ln of the largest vocabulary, and the smallest optimizer batch in tokens. Unknown (None) without a sweep (the
    synthetic demo) or where a spec cannot be read back (a tokenizer file since moved)."""
    import math

    from upscale.fitting.dstar import Limits
    from upscale.sweeps.data_sources import vocab_size_of
    from upscale.sweeps.spec import parse_spec, resolve

    vocabs, batches = [], []
    for sweep_id in sweep_ids:
        try:
            spec = parse_spec(services.store.sweep(sweep_id).spec)
            m = spec.model.dense_model
            vocabs.append(m.vocab_size if m is not None else spec.model.vocab_size or vocab_size_of(spec.data))
            batches += [rc.tokens_per_step for rc in resolve(spec).recipes]
        except (ValueError, OSError) as e:  # SpecError is a ValueError: the limits stay unknown, the analysis runs
            log.warning("sweep %s: no loss or batch limits for its answers (%s)", sweep_id, e)
    return Limits(math.log(max(vocabs)) if vocabs else None, float(min(batches)) if batches else None)


def _one_line(e: BaseException) -> str:
    return traceback.format_exception_only(e)[-1].strip()[:4000]


def _claim(store: Store, ids: list[str], digest: str, observed: str, params: dict[str, Any], trigger: str,
           owner: str) -> tuple[AnalysisRecord, bool]:
    """Insert the `running` row for these inputs (True: this call runs it), or return the row another call made:
    done as it is; failed or stale, taken over with a conditional UPDATE (one racer wins); running, once it ends."""
    row = AnalysisRecord(id=uuid.uuid4().hex[:12], sweep_ids=ids, sweep_key=sweep_key(ids), inputs_hash=digest,
                         observations_hash=observed, status="running", trigger=trigger, params=params, plots=[],
                         owner=owner, created_at=utcnow())
    try:
        with store.transaction() as s:
            s.add(row)
        row.ran = True
        return row, True
    except IntegrityError:  # the unique (sweep_key, inputs_hash): these inputs have a row already
        pass
    while True:
        with store.transaction() as s:
            existing = s.scalar(select(AnalysisRecord).where(AnalysisRecord.sweep_key == row.sweep_key,
                                                             AnalysisRecord.inputs_hash == digest))
        if existing.status == "done":
            existing.ran = False
            return existing, False
        now = utcnow()
        with store.transaction() as s:
            taken = s.execute(
                update(AnalysisRecord)
                .where(AnalysisRecord.id == existing.id,
                       or_(AnalysisRecord.status == "failed",
                           (AnalysisRecord.status == "running")
                           & (AnalysisRecord.created_at < now - timedelta(seconds=STALE_RUNNING_S))))
                .values(status="running", error=None, trigger=trigger, owner=owner, created_at=now,
                        finished_at=None)).rowcount
        if taken:
            existing.status, existing.error, existing.trigger, existing.owner = "running", None, trigger, owner
            existing.created_at, existing.finished_at, existing.ran = now, None, True
            return existing, True
        time.sleep(WAIT_POLL_S)


def _finish(store: Store, row: AnalysisRecord, **values: Any) -> None:
    """End a claimed row (status done or failed) in the store and on ``row``."""
    values["finished_at"] = utcnow()
    with store.transaction() as s:
        s.execute(update(AnalysisRecord).where(AnalysisRecord.id == row.id).values(**values))
    for name, value in values.items():
        setattr(row, name, value)


def _draw(analysis: Analysis, tables: dict[str, pd.DataFrame], folder: Path) -> DrawnPlots:
    """The analysis's plots in ``folder`` (fitting/analysis_plots.py); a plot that fails is a warning, never a
    failed analysis."""
    from upscale.fitting.analysis_plots import draw_analysis
    from upscale.fitting.plots import DrawnPlots

    try:
        with PLOT_LOCK:
            return draw_analysis(analysis, tables, folder)
    except Exception as e:  # a plot is never worth the analysis
        log.warning("analysis plots not drawn in %s: %s", folder, _one_line(e))
        return DrawnPlots(skipped=[f"every plot: {_one_line(e)}"])


def _log_to_mlflow(services: Services, record: AnalysisRecord, folder: Path) -> None:
    """The analysis in MLflow (control/analysis_run.py): the sweep's own on its run, shown there if it is the newest;
    one of several sweeps or a refit on a run of its own under theirs. MLflow being down never fails the analysis."""
    from upscale.control.analysis_run import AnalysisMeta, log_analysis
    from upscale.orchestrator.observations import table
    from upscale.orchestrator.tracking import RunTree

    runs = [(sweep_id, run_id) for sweep_id in record.sweep_ids
            if (run_id := services.store.sweep(sweep_id).mlflow_run_id) is not None]
    if not runs:
        return
    seen: set[str] = set()  # a segment shared by two sweeps is one observation
    observations = [o for sweep_id in record.sweep_ids for o in services.store.observations(sweep_id)
                    if not (o.segment_key in seen or seen.add(o.segment_key))]
    meta = AnalysisMeta(record.id, record.sweep_ids, record.trigger, record.owner, as_utc(record.created_at))
    try:
        log_analysis(RunTree.for_settings(services.settings), runs, meta, record.record, table(observations),
                     folder if record.plots else None)
    except Exception as e:  # MLflow down, a bad artifact: the analysis stands
        log.warning("analysis %s not logged to MLflow: %s", record.id, _one_line(e))


def public_json(record: AnalysisRecord) -> dict[str, Any]:
    """What `upscale analyze --json` prints and MLflow keeps: the row's identity and the Analysis JSON."""
    return {"id": record.id, "sweep_ids": record.sweep_ids, "status": record.status, "trigger": record.trigger,
            "params": record.params, "created_at": as_utc(record.created_at).isoformat(),
            "finished_at": as_utc(record.finished_at).isoformat() if record.finished_at else None,
            "error": record.error, "analysis": record.record, "plots": record.plots}


def public(record: AnalysisRecord, plots: dict[str, str]) -> AnalysisPublic:
    """An analysis as the API shows it (GET /analyses, `upscale analyze --json`): ``plots`` maps each plot's name to
    where its PNG is (a URL from the routes, a file path in-process)."""
    return AnalysisPublic(id=record.id, sweep_ids=record.sweep_ids, status=record.status, trigger=record.trigger,
                          owner=record.owner, params=record.params, created_at=record.created_at,
                          finished_at=record.finished_at, error=record.error, analysis=record.record, plots=plots)


def age_s(record: AnalysisRecord) -> float:
    """Seconds since the analysis finished."""
    return (utcnow() - as_utc(record.finished_at or record.created_at)).total_seconds()


def _of_sweep(sweep_id: str | None) -> ColumnElement[bool]:
    """Rows whose sweeps include ``sweep_id`` (sweep_key is the sorted ids joined by ',')."""
    if sweep_id is None:
        return true()
    key = AnalysisRecord.sweep_key
    return or_(key == sweep_id, key.startswith(f"{sweep_id},"), key.endswith(f",{sweep_id}"),
               key.contains(f",{sweep_id},"))


def latest_analysis(store: Store, sweep_id: str | None = None) -> AnalysisRecord | None:
    """The newest done analysis (of any sweeps, or of those including ``sweep_id``), or None."""
    with store.transaction() as s:
        return s.scalar(select(AnalysisRecord).where(AnalysisRecord.status == "done", _of_sweep(sweep_id))
                        .order_by(AnalysisRecord.finished_at.desc()).limit(1))


def analyses(store: Store, sweep_id: str | None = None) -> list[AnalysisRecord]:
    """Every analysis (running and failed ones too), newest first."""
    with store.transaction() as s:
        return list(s.scalars(select(AnalysisRecord).where(_of_sweep(sweep_id))
                              .order_by(AnalysisRecord.created_at.desc())))


def why_no_analysis(services: Services, sweep_id: str | None = None) -> str:
    """What is missing for a done analysis to exist (of ``sweep_id``, or of any sweep), as one sentence."""
    where = f"sweep {sweep_id}" if sweep_id else "any sweep"
    history = analyses(services.store, sweep_id)
    running = next((a for a in history if a.status == "running"), None)
    if running is not None:
        return (f"no finished analysis of {where} yet: analysis {running.id} (sweeps {running.sweep_key}) is "
                f"running since {as_utc(running.created_at):%Y-%m-%d %H:%M:%S} UTC; ask again when it finishes")
    if history and history[0].status == "failed":
        return f"the last analysis of {where} ({history[0].id}) failed: {history[0].error}"
    if sweep_id is not None:
        sweep = services.store.sweep(sweep_id)
        if not services.store.observations(sweep_id):
            return (f"sweep {sweep_id} has no finished segments yet (status {sweep.status}): its analysis runs when "
                    f"they finish")
        return (f"sweep {sweep_id} has no analysis yet: it runs when the sweep finishes; POST "
                f"/sweeps/{sweep_id}/analysis runs it now")
    if not any(services.store.observations(s.id) for s in services.store.sweeps()):
        return "no sweep has finished segments yet: an analysis runs by itself when a sweep finishes"
    return ("no analysis yet: one runs by itself when a sweep finishes; POST /sweeps/{id}/analysis runs one now")


def decision(services: Services, n1: float, d1: float, d2: float, sweep_id: str | None = None,
             group: str | None = None) -> DecisionPublic:
    """The verdict for (N1, D1, D2) from the newest done analysis (of ``sweep_id``'s sweeps, if given), with the
    analysis it came from. NotReady (409) when no analysis can answer, saying what is missing; ValueError (422) for
    a group the analysis does not have, and OutOfRange (422) for a question outside the law's sane region."""
    from upscale.fitting.analysis import Analysis
    from upscale.fitting.dstar import OutOfRange

    if sweep_id is not None:
        services.store.sweep(sweep_id)  # 404 for an unknown sweep
    record = latest_analysis(services.store, sweep_id)
    if record is None:
        raise NotReady(why_no_analysis(services, sweep_id))
    analysis = Analysis.from_json(record.record)
    labels = [u.label for u in analysis.upcycled]
    if group is not None and group not in labels:
        raise FitError(f"group: analysis {record.id} has no upcycling group {group!r}; it has "
                       f"{', '.join(repr(label) for label in labels) or 'none'}")
    try:
        verdict = analysis.decision(n1, d1, d2, group)
    except OutOfRange:  # the law's answer would be meaningless here: 422, saying why and what the data cover
        raise
    except FitError as e:
        raise NotReady(f"analysis {record.id} (sweeps {record.sweep_key}) cannot answer: {e}") from None
    return DecisionPublic(**verdict, analysis=analysis_ref(record))


def analysis_ref(record: AnalysisRecord) -> dict[str, Any]:
    """Which analysis an answer came from, and how old it is."""
    return {"id": record.id, "sweep_ids": record.sweep_ids, "created_at": as_utc(record.created_at),
            "finished_at": as_utc(record.finished_at) if record.finished_at else None, "age_s": age_s(record)}


def sweep_owner(services: Services, sweep_id: str) -> str:
    from upscale.control.sweeps import owners

    return owners(services).get(sweep_id, "upscale")


def analyse_if_new(services: Services, sweep_id: str, bootstrap: int = DEFAULT_ANALYSIS_BOOTSTRAP,
                   cache: ObservationCache | None = None) -> AnalysisRecord | None:
    """Analyse a sweep whose observations differ from those of its latest analysis (of any status: the same failing
    inputs are not retried); None when they do not, or when it has none."""
    tables = sweep_tables(services, [sweep_id], cache)
    if not any(len(t) for t in tables.values()):
        return None
    with services.store.transaction() as s:
        latest = s.scalar(select(AnalysisRecord).where(AnalysisRecord.sweep_key == sweep_id)
                          .order_by(AnalysisRecord.created_at.desc()).limit(1))
    if latest is not None and latest.observations_hash == observations_hash(tables):
        return None
    return run_analysis(services, [sweep_id], bootstrap=bootstrap, owner=sweep_owner(services, sweep_id),
                        trigger="completed" if latest is None else "observations", tables=tables)


class AnalysisLoop(SupervisedLoop):
    """Every ``tick_s``, analyses each settled sweep (done, failed or cancelled) whose observations changed since
    its latest analysis: a sweep that just completed, was extended or got late segments. ``policy`` `off` (the
    setting UPSCALE_ANALYSIS_POLICY) runs none. A failure is recorded on the analysis row, never fatal to the loop;
    one analysis at a time, with one process for the bootstrap, so it costs one core at most."""

    def __init__(self, services: Services, tick_s: float = 5.0, policy: str | None = None,
                 bootstrap: int = DEFAULT_ANALYSIS_BOOTSTRAP) -> None:
        super().__init__("upscale-analyses", tick_s, stuck_after_s=STALE_RUNNING_S)
        self.services, self.bootstrap = services, bootstrap
        self.policy = policy if policy is not None else services.settings.analysis_policy

    def tick(self) -> None:
        if self.policy == "off":
            return
        cache = ObservationCache(self.services)
        for sweep in self.services.store.sweeps():
            if self.stopping.is_set():
                return
            if sweep.status not in SETTLED:
                continue
            try:
                analyse_if_new(self.services, sweep.id, self.bootstrap, cache)
            except Exception as e:  # recorded on the row by run_analysis; the loop goes on
                log.warning("analysis of sweep %s failed: %s", sweep.id, _one_line(e))
