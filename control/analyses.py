"""The service's analyses: the paper's analysis (fitting/analysis.py `analyze`) run on sweeps' observations, kept in
the `analyses` table with its plots under <home>/analyses/<id>/, and the loop that runs it by itself.

One analysis per (sweeps, inputs): the inputs hash covers the observation tables and the parameters (N1s,
bootstrap, seed, the record's version), and the row is inserted before the work starts, so of two triggers for the
same inputs (a request and the loop, two loops, two requests) one runs it and the others get its record: the done
one, or AnalysisRunning (HTTP 409 naming it) while it runs. Nobody waits for another caller's work. A row names the
process running it (`runner`); a `running` row whose runner is gone (a server stopped or killed mid-analysis) is
interrupted: the next trigger takes it over, and the loop marks it failed with an error starting "interrupted" and
runs it again: a requested analysis with the parameters it was requested with (`rerun_interrupted_requests`), the
sweep's own with the loop's. A `failed` row is retried by the next explicit trigger (a request, a refit, the
demo); the loop does not retry the same inputs unless they were interrupted.

A sweep's decisions answer from its own analyses: those the loop, its owner (or an admin) or the CLI made. A refit
is its schedule owner's: its inputs hash is its own (one per owner), so it never stands in for the sweep's analysis,
and `latest_analysis` never returns it; refit versions name it (control/refits.py).

Everything that answers from an analysis reads the newest *done* one: GET /decisions/upcycle, `upscale decide`
and `upscale dstar` without fit files, GET /sweeps/{id}/analysis.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import math
import os
import socket
import threading
import traceback
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from sqlalchemy import ColumnElement, or_, select, true, update
from sqlalchemy.exc import IntegrityError

from upscale.control.analysis_jobs import AnalysisJobs, Interrupted, stop_when
from upscale.control.analysis_settings import sweep_source, with_settings
from upscale.control.fits import PLOT_LOCK, ObservationCache, observations_table
from upscale.control.records import AnalysisRecord
from upscale.control.schemas import (
    DEFAULT_ANALYSIS_BOOTSTRAP,
    AnalysisPublic,
    DecisionPublic,
    ExpansionDecisionPublic,
)
from upscale.control.supervised import SupervisedLoop
from upscale.fitting.curve_observations import TrunkCurves, predicted_decays, trunks_hash
from upscale.fitting.dstar import Limits, OutOfRange
from upscale.fitting.errors import FitError
from upscale.orchestrator.clock import as_utc, utcnow
from upscale.orchestrator.observations import table
from upscale.sweeps.data_sources import vocab_size_of
from upscale.sweeps.spec import parse_spec
from upscale.sweeps.steps import resolve

if TYPE_CHECKING:  # no cycle: what loads Ray, MLflow, the fitting stack or matplotlib stays out of the CLI's reads
    from upscale.control.services import Services
    from upscale.fitting.analysis import Analysis, Progress
    from upscale.fitting.plots import DrawnPlots
    from upscale.orchestrator.store import Store

log = logging.getLogger(__name__)

KINDS = ("dense", "scratch", "upcycled", "expanded")  # the tables `analyze` takes; expanded: expert upcycling
STALE_RUNNING_S = 3600.0  # a `running` row of another host (or of none) older than this is taken over
INTERRUPTED = "interrupted"  # how the error of an analysis whose process stopped mid-way begins: the loop reruns it
SETTLED = ("done", "failed", "cancelled")  # sweep states the loop analyses: nothing more is coming for now
POLICIES = ("on_new_observations", "off")


class NotReady(RuntimeError):
    """Nothing can answer yet (no observations, no analysis, the analysis cannot answer): HTTP 409, and the message
    says what is missing."""


class AnalysisRunning(NotReady):
    """Another caller is running the analysis of these inputs: HTTP 409 naming it (``record``), never a wait."""

    def __init__(self, record: AnalysisRecord) -> None:
        self.record = record
        super().__init__(f"analysis {record.id} of these inputs is running (trigger {record.trigger}, since "
                         f"{as_utc(record.created_at):%Y-%m-%d %H:%M:%S} UTC): GET /analyses/{record.id} shows it "
                         f"and says when it is done")


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
    """sha256 of the tables' rows, without their MLflow run ids (which say where a row is logged, not what it is) and
    parent_experts (only expanded rows set it, and their segment keys already tell them apart), and without an empty
    expanded table: a sweep without expansions hashes as it did before they existed, so its analyses are reused."""
    h = hashlib.sha256()
    for kind in KINDS:
        if kind == "expanded" and not len(tables.get(kind, ())):  # none: the hash tables without it always had
            continue
        h.update(kind.encode())
        h.update(tables[kind].drop(columns=["mlflow_run_id", "parent_experts"], errors="ignore")
                 .to_csv(index=False).encode())
    return h.hexdigest()


def analysis_params(n1s: Sequence[float] | None, bootstrap: int, seed: int,
                    decisions: Sequence[tuple[float, float, float]] | None = None,
                    trunks: Sequence[TrunkCurves] | None = None) -> dict[str, Any]:
    """The parameters as the row keeps and hashes them; with trunk curves to predict decays from, ``curves``: the
    hash of those curves (an analysis without them keeps the parameters, and so the inputs hash, it always had)."""
    params = {"n1s": sorted(float(n) for n in n1s) if n1s else None, "bootstrap": int(bootstrap), "seed": int(seed),
              "decisions": [list(map(float, d)) for d in decisions] if decisions else None}
    if trunks:
        params["curves"] = trunks_hash(trunks)
    return params


def curve_trunks(services: Services, sweep_ids: Sequence[str], curves: bool,
                 cache: ObservationCache | None = None) -> list[TrunkCurves] | None:
    """The sweeps' trunk curves as the decay predictions read them, when asked for (``curves``) and some trunk has a
    decay on its trained part to predict; read once per ``cache`` (a refit tick's reads), the predictions are the
    analysis's work."""
    if not curves:
        return None
    from upscale.control.curves import fitting_trunks, sweep_curves  # Ray and MLflow: only where curves are read

    def read() -> list[TrunkCurves]:
        return fitting_trunks(sweep_curves(services, sweep_ids, cache))

    trunks = cache.curves(sweep_ids, read) if cache is not None else read()
    return trunks if any(t.interior for t in trunks) else None


def inputs_hash(observations: str, params: dict[str, Any], refit_owner: str | None = None) -> str:
    """sha256 of the observations' hash, the parameters and the record's version: equal inputs, one analysis. A
    refit's (``refit_owner``: its schedule's owner) are that owner's own inputs, never a sweep's own analysis."""
    from upscale.fitting.analysis import ANALYSIS_VERSION  # the fitting stack: not for the CLI's reads

    inputs = {"observations": observations, "params": params, "version": ANALYSIS_VERSION}
    if refit_owner is not None:
        inputs["refit_owner"] = refit_owner
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def run_analysis(services: Services, sweep_ids: Sequence[str], *, n1s: Sequence[float] | None = None,
                 bootstrap: int = DEFAULT_ANALYSIS_BOOTSTRAP, seed: int = 0, owner: str, trigger: str,
                 progress: Progress | None = None, tables: dict[str, pd.DataFrame] | None = None,
                 decisions: Sequence[tuple[float, float, float]] | None = None, workers: int = 1,
                 cache: ObservationCache | None = None, curves: bool = True,
                 trunks: list[TrunkCurves] | None = None) -> AnalysisRecord:
    """Analyse the sweeps' observations in this thread and keep the record; the existing record when these inputs
    were analysed already (``.ran`` says which). ``tables``: the sweeps' tables when the caller read them already
    (a refit tick), or data that is in no sweep (the synthetic demo, ``sweep_ids`` empty). ``curves``: fit the
    decay ends the sweeps' trunk curves predict beside the observed ones, when they have curves; ``trunks``: those
    curves when the caller read them already (`curve_trunks`), so that they are the ones it hashed.

    NotFoundError for an unknown sweep, NotReady when the sweeps have no finished segment, AnalysisRunning when
    another caller runs these inputs now, FitError when there is nothing the analysis can fit (the row is then
    `failed` with that error, as for any failure)."""
    work = _Work.read(services, sweep_ids, n1s, bootstrap, seed, decisions, tables, cache, owner, trigger, curves,
                      trunks)
    record = work.claim()
    return work.run(record, workers, progress) if record.ran else record


def request_analysis(services: Services, sweep_id: str, *, n1s: Sequence[float] | None, bootstrap: int, seed: int,
                     owner: str, jobs: AnalysisJobs, curves: bool = True) -> AnalysisRecord:
    """What POST /sweeps/{id}/analysis does, without waiting for the work: the done record when these inputs were
    analysed (``.ran`` False), else the claimed `running` row, its work started on ``jobs``' threads (``.ran``
    True). AnalysisRunning when another caller runs these inputs; TooManyAnalyses, before any row is written, when
    ``owner`` has as many running as ``jobs`` allows."""
    work = _Work.read(services, [sweep_id], n1s, bootstrap, seed, None, None, None, owner, "request", curves)
    found = _found(services.store, work.row.sweep_key, work.row.inputs_hash)
    if found is not None and found.status == "done":
        return found
    with jobs.reserve(owner) as start:
        record = work.claim()
        if record.ran:
            start(lambda progress: work.run(record, 1, progress))
    return record


class _Work:
    """One analysis's inputs (the tables, their parameters and hash, the unclaimed row) and running it."""

    def __init__(self, services: Services, row: AnalysisRecord, tables: dict[str, pd.DataFrame],
                 decisions: Sequence[tuple[float, float, float]] | None, trunks: list[TrunkCurves] | None) -> None:
        self.services, self.row, self.tables, self.decisions = services, row, tables, decisions
        self.trunks = trunks

    @classmethod
    def read(cls, services: Services, sweep_ids: Sequence[str], n1s: Sequence[float] | None, bootstrap: int,
             seed: int, decisions: Sequence[tuple[float, float, float]] | None,
             tables: dict[str, pd.DataFrame] | None, cache: ObservationCache | None, owner: str,
             trigger: str, curves: bool = True, trunks: list[TrunkCurves] | None = None) -> _Work:
        """Read the sweeps' tables and their trunk curves (with ``curves``), unless given, and hash the inputs;
        nothing is written."""
        ids = sorted(set(sweep_ids))
        for sweep_id in ids:
            services.store.sweep(sweep_id)  # NotFoundError (404) before anything is read
        tables = tables if tables is not None else sweep_tables(services, ids, cache)
        if not any(len(t) for t in tables.values()):
            raise NotReady(f"sweep {', '.join(ids)} has no finished segments yet: the analysis needs the losses of "
                           f"finished decay segments; it runs by itself when they finish")
        trunks = trunks if trunks is not None else curve_trunks(services, ids, curves)
        params = analysis_params(n1s, bootstrap, seed, decisions, trunks)
        observed = observations_hash(tables)
        row = AnalysisRecord(id=uuid.uuid4().hex[:12], sweep_ids=ids, sweep_key=sweep_key(ids),
                             inputs_hash=inputs_hash(observed, params, owner if trigger == "refit" else None),
                             observations_hash=observed, status="running", trigger=trigger, params=params,
                             plots=[], owner=owner)
        return cls(services, row, tables, decisions, trunks)

    def claim(self) -> AnalysisRecord:
        return _claim(self.services.store, self.row)

    def run(self, record: AnalysisRecord, workers: int, progress: Progress | None) -> AnalysisRecord:
        """Run the claimed ``record``, end it done or failed (never left `running`) and log it to MLflow."""
        from upscale.fitting.analysis import analyze  # the fitting stack: only where an analysis runs

        services, params = self.services, record.params
        try:
            predicted = predicted_decays(self.trunks) if self.trunks else None
            analysis = analyze(self.tables, params["n1s"], self.decisions, params["bootstrap"], params["seed"],
                               workers, progress, sweep_limits(services, record.sweep_ids), curves=predicted)
            analysis = with_settings(analysis, sweep_source(record.sweep_ids), self.tables)
            folder = analysis_dir(services.settings.home, record.id)
            drawn = _draw(analysis, self.tables, folder)
            _finish(services.store, record, status="done",
                    record={**analysis.to_json(), "plots_skipped": drawn.skipped}, plots=drawn.names)
        except BaseException as e:  # any failure is the row's; FitError reaches callers as a 422
            stopped = isinstance(e, Interrupted) or not isinstance(e, Exception)  # a server stop, ^C, SystemExit
            _finish(services.store, record, status="failed",
                    error=f"{INTERRUPTED}: {_one_line(e)}; it runs again" if stopped else _one_line(e))
            raise
        _log_to_mlflow(services, record, folder)
        return record


def sweep_limits(services: Services, sweep_ids: Sequence[str]) -> Limits:
    """The laws' sane region for these sweeps' models (fitting/dstar.py `Limits`): the loss of an untrained model,
    ln of the largest vocabulary, and the smallest optimizer batch in tokens. Unknown (None) without a sweep (the
    synthetic demo) or where a spec cannot be read back (a tokenizer file since moved)."""
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
    return (traceback.format_exception_only(e)[-1].strip() or type(e).__name__)[:4000]


def _this_process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


_IN_FLIGHT: dict[str, tuple[str, Store]] = {}  # this process's claims: runner -> (analysis id, its store)
_IN_FLIGHT_LOCK = threading.Lock()


def runner_gone(record: AnalysisRecord) -> bool:
    """Whether nobody runs this `running` row any more. Its runner is host:pid:nonce, a nonce per claim: of this
    process, gone once the claim ended (or the pid's earlier owner made it); of another process on this host, gone
    with that pid; of another host, STALE_RUNNING_S after the claim. A row claimed before runners were recorded
    counts as gone once older than STALE_RUNNING_S."""
    from upscale.orchestrator.scheduler import owner_alive  # Ray: not for the CLI's reads of stored analyses

    if record.runner is None:
        return (utcnow() - as_utc(record.created_at)).total_seconds() >= STALE_RUNNING_S
    if record.runner.rsplit(":", 1)[0] == _this_process():
        return record.runner not in _IN_FLIGHT
    return not owner_alive(record.runner, record.created_at, STALE_RUNNING_S)


def interrupted(record: AnalysisRecord) -> bool:
    """Whether the row's run was cut short (its process stopped or died), not failed on its inputs."""
    if record.status == "running":
        return runner_gone(record)
    return record.status == "failed" and (record.error or "").startswith(INTERRUPTED)


def _found(store: Store, key: str, digest: str) -> AnalysisRecord | None:
    """The row of these inputs if there is one; AnalysisRunning when it is running and its runner is alive."""
    with store.transaction() as s:
        found = s.scalar(select(AnalysisRecord).where(AnalysisRecord.sweep_key == key,
                                                      AnalysisRecord.inputs_hash == digest))
    if found is not None and found.status == "running" and not runner_gone(found):
        raise AnalysisRunning(found)
    return found


def _claim(store: Store, row: AnalysisRecord) -> AnalysisRecord:
    """Insert ``row`` as these inputs' `running` row (``.ran`` True: this call runs it), or take the row another
    call made: done, as it is (``.ran`` False); failed or interrupted, taken over with a conditional UPDATE (one
    racer wins); running, AnalysisRunning at once. The claim is noted in this process before it is written, so that
    no thread here ever takes it for a dead process's."""
    row.created_at, row.runner = utcnow(), f"{_this_process()}:{uuid.uuid4().hex[:8]}"
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT[row.runner] = (row.id, store)
    claimed: AnalysisRecord | None = None
    try:
        try:
            with store.transaction() as s:
                s.add(row)
            claimed = row
            claimed.ran = True
            return claimed
        except IntegrityError:  # the unique (sweep_key, inputs_hash): these inputs have a row already
            pass
        for _ in range(3):  # a lost race reads the row again: then done, or running
            existing = _found(store, row.sweep_key, row.inputs_hash)
            if existing.status == "done":
                existing.ran = False
                return existing
            taken = {"status": "running", "error": None, "trigger": row.trigger, "owner": row.owner,
                     "created_at": row.created_at, "finished_at": None, "runner": row.runner}
            with _IN_FLIGHT_LOCK:
                _IN_FLIGHT[row.runner] = (existing.id, store)
            with store.transaction() as s:
                won = s.execute(update(AnalysisRecord)
                                .where(AnalysisRecord.id == existing.id, AnalysisRecord.status == existing.status,
                                       _runner_is(existing.runner))
                                .values(**taken)).rowcount
            if won:
                for name, value in taken.items():
                    setattr(existing, name, value)
                claimed = existing
                claimed.ran = True
                return claimed
        raise AnalysisRunning(existing)
    finally:
        if claimed is None:
            with _IN_FLIGHT_LOCK:
                _IN_FLIGHT.pop(row.runner, None)


def _runner_is(runner: str | None) -> ColumnElement[bool]:
    """The row's runner is still ``runner``: the condition of every take-over, so that one racer wins."""
    return AnalysisRecord.runner.is_(None) if runner is None else AnalysisRecord.runner == runner


def _finish(store: Store, row: AnalysisRecord, **values: Any) -> None:
    """End a claimed row (status done or failed) in the store and on ``row``."""
    runner = row.runner
    values["finished_at"], values["runner"] = utcnow(), None
    with store.transaction() as s:  # unless it was ended at exit (interrupt_in_flight) or taken over since
        s.execute(update(AnalysisRecord).where(AnalysisRecord.id == row.id, AnalysisRecord.runner == runner)
                  .values(**values))
    for name, value in values.items():
        setattr(row, name, value)
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.pop(runner, None)


def stop_requested(services: Services) -> None:
    """The server is stopping: the requested analyses' threads stop at their next progress step, and every analysis
    this process runs on its store (the analysis loop's too) ends failed, "interrupted", now: uvicorn ends the
    process with the SIGTERM it caught, so neither the threads nor exit hooks get to."""
    services.jobs.stop()
    interrupt_in_flight(services.store)


def interrupt_in_flight(store: Store | None = None) -> None:
    """Mark the analyses this process is running (on ``store``, or on any) failed, interrupted, so that they never
    stay `running` and the analysis loop of the next start runs them again: at a server's shutdown, and at exit."""
    with _IN_FLIGHT_LOCK:
        left = [(runner, claim) for runner, claim in _IN_FLIGHT.items() if store in (None, claim[1])]
        for runner, _ in left:
            del _IN_FLIGHT[runner]
    for runner, (analysis_id, store) in left:
        try:
            with store.transaction() as s:
                s.execute(update(AnalysisRecord)
                          .where(AnalysisRecord.id == analysis_id, AnalysisRecord.runner == runner)
                          .values(status="failed", finished_at=utcnow(), runner=None,
                                  error=f"{INTERRUPTED}: the process running it stopped; it runs again"))
        except Exception as e:  # exiting anyway: the next start sees the runner gone
            log.warning("analysis %s left running at exit: %s", analysis_id, _one_line(e))


atexit.register(interrupt_in_flight)


def _draw(analysis: Analysis, tables: dict[str, pd.DataFrame], folder: Path) -> DrawnPlots:
    """The analysis's plots in ``folder`` (fitting/analysis_plots.py); a plot that fails is a warning, never a
    failed analysis."""
    from upscale.fitting.analysis_plots import draw_analysis  # matplotlib: loaded by the first analysis drawn
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
    from upscale.control.analysis_run import AnalysisMeta, log_analysis  # MLflow: only where an analysis is logged
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


ANSWERING = AnalysisRecord.trigger != "refit"  # the analyses decisions answer from: a refit is its schedule's


def latest_analysis(store: Store, sweep_id: str | None = None) -> AnalysisRecord | None:
    """The newest done analysis that answers decisions (not a refit's), of any sweeps or of those including
    ``sweep_id``; None if there is none."""
    with store.transaction() as s:
        return s.scalar(select(AnalysisRecord).where(AnalysisRecord.status == "done", ANSWERING, _of_sweep(sweep_id))
                        .order_by(AnalysisRecord.finished_at.desc()).limit(1))


def analyses(store: Store, sweep_id: str | None = None, answering: bool = False) -> list[AnalysisRecord]:
    """Every analysis (running and failed ones too; only those that answer decisions if ``answering``), newest
    first."""
    with store.transaction() as s:
        return list(s.scalars(select(AnalysisRecord).where(_of_sweep(sweep_id), ANSWERING if answering else true())
                              .order_by(AnalysisRecord.created_at.desc())))


def why_no_analysis(services: Services, sweep_id: str | None = None) -> str:
    """What is missing for a done analysis to exist (of ``sweep_id``, or of any sweep), as one sentence."""
    where = f"sweep {sweep_id}" if sweep_id else "any sweep"
    history = analyses(services.store, sweep_id, answering=True)
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


def _answering(services: Services, sweep_id: str | None) -> tuple[AnalysisRecord, Analysis]:
    """The newest done analysis (of ``sweep_id``'s sweeps, if given) a decision answers from; NotReady (409) when
    there is none, saying what is missing."""
    from upscale.fitting.analysis import Analysis  # the fitting stack: only where a verdict is read

    if sweep_id is not None:
        services.store.sweep(sweep_id)  # 404 for an unknown sweep
    record = latest_analysis(services.store, sweep_id)
    if record is None:
        raise NotReady(why_no_analysis(services, sweep_id))
    return record, Analysis.from_json(record.record)


def _unknown(what: str, name: str, record: AnalysisRecord, labels: Sequence[str]) -> FitError:
    return FitError(f"{what}: analysis {record.id} has no {'upcycling group' if what == 'group' else 'expansion study'}"
                    f" {name!r}; it has {', '.join(repr(label) for label in labels) or 'none'}")


def _cannot(record: AnalysisRecord, e: FitError) -> NotReady:
    return NotReady(f"analysis {record.id} (sweeps {record.sweep_key}) cannot answer: {e}")


def decision(services: Services, n1: float, d1: float, d2: float, sweep_id: str | None = None,
             group: str | None = None) -> DecisionPublic:
    """The verdict for (N1, D1, D2) from the newest done analysis (of ``sweep_id``'s sweeps, if given), with the
    analysis it came from. NotReady (409) when no analysis can answer, saying what is missing; ValueError (422) for
    a group the analysis does not have, and OutOfRange (422, a FitError raised as is) for a question outside the
    law's sane region."""
    record, analysis = _answering(services, sweep_id)
    labels = [u.label for u in analysis.upcycled]
    if group is not None and group not in labels:
        raise _unknown("group", group, record, labels)
    try:
        verdict = analysis.decision(n1, d1, d2, group)
    except OutOfRange:  # the law's answer would be meaningless here: 422, saying why and what the data cover
        raise
    except FitError as e:
        raise _cannot(record, e) from None
    return DecisionPublic(**verdict, analysis=analysis_ref(record))


def expansion_decision(services: Services, n1: float, d1: float, d2: float, sweep_id: str | None = None,
                       study: str | None = None) -> ExpansionDecisionPublic:
    """Expand the E-expert parent trained D1 tokens and train it D2 more, or train the m·E MoE from scratch: one
    expansion study's verdict (``study``, by default the analysed one whose expanded law predicts the lowest loss
    at the point), as ``decision`` answers for upcycling, from the same analysis and with the same errors."""
    record, analysis = _answering(services, sweep_id)
    labels = [e.label for e in analysis.expansions]
    if study is not None and study not in labels:
        raise _unknown("study", study, record, labels)
    chosen = [e for e in analysis.expansions if study in (None, e.label)]
    if not chosen:
        raise NotReady(f"analysis {record.id} (sweeps {record.sweep_key}) has no expansion study: the sweep has no "
                       f"expanded runs (a spec's `expansion:` section trains them)")
    answers, errors = [], []
    for e in chosen:
        try:
            answers.append(e.decision(n1, d1, d2))
        except FitError as err:  # OutOfRange among them
            errors.append((e.label, err))
    if not answers:
        if all(isinstance(err, OutOfRange) for _, err in errors):
            raise errors[0][1]  # outside every study's sane region: 422, saying why
        raise NotReady(f"analysis {record.id} (sweeps {record.sweep_key}) has no expansion study that can answer "
                       f"here: " + "; ".join(f"{label}: {err}" for label, err in errors))
    best = min(answers, key=lambda a: a["loss_upcycled"])
    return ExpansionDecisionPublic(**best, analysis=analysis_ref(record))


def analysis_ref(record: AnalysisRecord) -> dict[str, Any]:
    """Which analysis an answer came from, and how old it is."""
    return {"id": record.id, "sweep_ids": record.sweep_ids, "created_at": as_utc(record.created_at),
            "finished_at": as_utc(record.finished_at) if record.finished_at else None, "age_s": age_s(record)}


def sweep_owner(services: Services, sweep_id: str) -> str:
    from upscale.control.sweeps import owners  # Ray and MLflow (the orchestrator): only the loops ask

    return owners(services).get(sweep_id, "upscale")


def analyse_if_new(services: Services, sweep_id: str, bootstrap: int = DEFAULT_ANALYSIS_BOOTSTRAP,
                   cache: ObservationCache | None = None, progress: Progress | None = None) -> AnalysisRecord | None:
    """Analyse a sweep whose observations differ from those of its latest own analysis, or whose trunk curves
    differ from those that analysis predicted decays from (a finished trunk piece adds no observation but moves the
    predictions; an analysis asked for without curves is left standing), of any status: the same failing inputs are
    not retried, but interrupted ones are. None when nothing differs, or when it has no observation. Refits are not
    its own: one of bob's never stands for alice's sweep's analysis."""
    tables = sweep_tables(services, [sweep_id], cache)
    if not any(len(t) for t in tables.values()):
        return None
    trunks = curve_trunks(services, [sweep_id], curves=True, cache=cache)
    with services.store.transaction() as s:
        latest = s.scalar(select(AnalysisRecord).where(AnalysisRecord.sweep_key == sweep_id, ANSWERING)
                          .order_by(AnalysisRecord.created_at.desc()).limit(1))
    if latest is not None and latest.observations_hash == observations_hash(tables) and not interrupted(latest):
        had = (latest.params or {}).get("curves")  # the hash of the curves it predicted from (`analysis_params`)
        if had is None or had == (trunks_hash(trunks) if trunks else None):
            return None
    return run_analysis(services, [sweep_id], bootstrap=bootstrap, owner=sweep_owner(services, sweep_id),
                        trigger="completed" if latest is None else "observations", tables=tables, progress=progress,
                        trunks=trunks)


def fail_interrupted(store: Store) -> list[str]:
    """Mark `running` rows whose runner is gone (a server stopped or killed mid-analysis without its exit hook)
    failed, interrupted, so that none stays `running` for ever; their ids."""
    with store.transaction() as s:
        running = list(s.scalars(select(AnalysisRecord).where(AnalysisRecord.status == "running")))
    failed = []
    for row in running:
        if not runner_gone(row):
            continue
        with store.transaction() as s:  # conditional: a trigger that took the row over since keeps it
            if s.execute(update(AnalysisRecord)
                         .where(AnalysisRecord.id == row.id, AnalysisRecord.status == "running",
                                _runner_is(row.runner))
                         .values(status="failed", finished_at=utcnow(), runner=None,
                                 error=f"{INTERRUPTED}: the process running it ({row.runner or 'unknown'}) is "
                                       f"gone; it runs again")).rowcount:
                failed.append(row.id)
    return failed


def rerun_interrupted_requests(services: Services, progress: Progress | None = None) -> list[str]:
    """Run again, as they were asked for (N1s, bootstrap, seed, decisions, curves), the requested analyses a stopped
    server interrupted; the ids of their records. On the same observations the interrupted row itself runs again, so
    whoever polls it gets its answer; on changed ones a new row does, and the old row's error names it, so that it
    is not run again."""
    with services.store.transaction() as s:
        rows = list(s.scalars(select(AnalysisRecord).where(AnalysisRecord.status == "failed",
                                                           AnalysisRecord.trigger == "request",
                                                           AnalysisRecord.error.startswith(INTERRUPTED))))
    ran = []
    for row in rows:
        asked = row.params or {}
        try:
            record = run_analysis(services, row.sweep_ids, n1s=asked.get("n1s"), bootstrap=asked["bootstrap"],
                                  seed=asked["seed"], decisions=asked.get("decisions"), owner=row.owner,
                                  trigger="request", curves="curves" in asked, progress=progress)
        except Interrupted:
            raise
        except Exception as e:  # recorded on the row it ran as; the other interrupted requests still run
            log.warning("interrupted analysis %s could not run again: %s", row.id, _one_line(e))
            continue
        if record.id != row.id:
            with services.store.transaction() as s:
                s.execute(update(AnalysisRecord).where(AnalysisRecord.id == row.id, AnalysisRecord.status == "failed")
                          .values(error=f"run again as analysis {record.id}: it had been interrupted, and the "
                                        f"sweeps' observations changed since"))
        ran.append(record.id)
    return ran


class AnalysisLoop(SupervisedLoop):
    """Every ``tick_s``, analyses each settled sweep (done, failed or cancelled) whose observations changed since
    its latest analysis: a sweep that just completed, was extended or got late segments. ``policy`` `off` (the
    setting UPSCALE_ANALYSIS_POLICY) runs none. Each tick first ends the rows whose runner is gone (failed,
    interrupted), and reruns interrupted analyses: requested ones with their requested parameters. A failure is
    recorded on the analysis row, never fatal to the loop; one analysis at a time, with one process for the
    bootstrap, so it costs one core at most; stopping the loop interrupts it at its next bootstrap step."""

    def __init__(self, services: Services, tick_s: float = 5.0, policy: str | None = None,
                 bootstrap: int = DEFAULT_ANALYSIS_BOOTSTRAP) -> None:
        super().__init__("upscale-analyses", tick_s, stuck_after_s=STALE_RUNNING_S)
        self.services, self.bootstrap = services, bootstrap
        self.policy = policy if policy is not None else services.settings.analysis_policy

    def tick(self) -> None:
        if self.policy == "off":
            return
        for analysis_id in fail_interrupted(self.services.store):
            log.warning("analysis %s was interrupted: it runs again", analysis_id)
        rerun_interrupted_requests(self.services, stop_when(self.stopping))
        cache = ObservationCache(self.services)
        for sweep in self.services.store.sweeps():
            if self.stopping.is_set():
                return
            if sweep.status not in SETTLED:
                continue
            try:
                analyse_if_new(self.services, sweep.id, self.bootstrap, cache, stop_when(self.stopping))
            except Exception as e:  # recorded on the row by run_analysis; the loop goes on
                log.warning("analysis of sweep %s failed: %s", sweep.id, _one_line(e))
