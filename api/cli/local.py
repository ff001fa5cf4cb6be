"""How a CLI command reaches the system: `connect(api, token)` gives `upscale.Client` over HTTP with `--api URL`,
else `Local`, the same methods called in-process on this machine's store. A command that has `--api` is one code
path either way: ``with connect(api, token) as c: c.cancel(sweep)``.

`Local` calls what the REST routes call (control/: sweeps, analyses, refits, suggest) on control/wiring.py
`open_services(settings, auth=False)` (the store opened with the prediction ledger's hooks), as LOCAL_OWNER (whoever
holds the database needs no token), and returns what `Client` returns: the routes' JSON as dicts and lists,
observations as a DataFrame read from the same CSV. A failure the API answers with 404, 409 or 422 is a user error
here too (one `error:` line).

The shared options (`ApiOpt`, `TokenOpt`) live here, so command modules import this one and never each other for
them. This module imports no command module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from upscale.api.cli.app import CommandError
from upscale.client import Client

if TYPE_CHECKING:
    import pandas as pd

    from upscale.control.services import Services
    from upscale.sweeps.spec import SweepSpec


ApiOpt = Annotated[str | None, typer.Option("--api", help="A remote server's URL, e.g. http://host:8000; default: "
                                            "in-process on this machine's store. UPSCALE_TIMEOUT: seconds to wait.")]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="UPSCALE_TOKEN", help="Bearer token for --api "
                                              "(`upscale token create`); reads need one too.")]


def local_services(auth: bool = False) -> Services:
    """This machine's store (UPSCALE_HOME), opened as the service opens it: migrated, with the ledger's hooks."""
    from upscale.control.wiring import open_services
    from upscale.orchestrator.settings import get_settings

    return open_services(get_settings(), auth=auth)


@contextmanager
def _user_errors() -> Iterator[None]:
    """What the API answers with 409 (NotReady) or 422 (any ValueError: a bad group, fits of the wrong kind...) as a
    CommandError; NotFoundError (404) is an OrchestratorError, already a user error."""
    from upscale.control.analyses import NotReady
    from upscale.orchestrator.errors import NotFoundError

    try:
        yield
    except NotFoundError:
        raise
    except (NotReady, ValueError) as e:
        raise CommandError(str(e)) from None


def _dump(model: Any) -> Any:
    """A pydantic model (or a list of them) as the route's JSON."""
    if isinstance(model, list):
        return [_dump(m) for m in model]
    return model.model_dump(mode="json")


class Local:
    """`upscale.Client`'s methods that the CLI uses, in-process on this machine's store (no network, no token)."""

    url = "in-process"

    @cached_property
    def services(self) -> Services:
        return local_services()

    def __enter__(self) -> Local:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if "services" in self.__dict__:
            self.services.store.engine.dispose()

    def __repr__(self) -> str:
        return "Local()"

    # -- sweeps ------------------------------------------------------------------------------------------------

    def sweeps(self) -> list[dict[str, Any]]:
        from upscale.control import sweeps

        return _dump(sweeps.summaries(self.services))

    def sweep(self, sweep_id: str) -> dict[str, Any]:
        from upscale.control import sweeps

        return json.loads(sweeps.detail_json(self.services, sweep_id)[1])  # the very bytes GET /sweeps/{id} sends

    def submit(self, spec: str | os.PathLike[str] | Mapping[str, Any] | SweepSpec, *, new: bool = False,
               reuse_stale: bool = False) -> dict[str, Any]:
        from upscale.control import sweeps
        from upscale.control.services import LOCAL_OWNER
        from upscale.sweeps.loader import parse_document

        if isinstance(spec, str | os.PathLike):
            path = Path(spec)
            data = parse_document(path.read_bytes(), "json" if path.suffix == ".json" else "yaml")
        else:
            data = spec.model_dump(mode="json") if hasattr(spec, "model_dump") else dict(spec)
        return _dump(sweeps.submit(self.services, sweeps.admit(self.services, data), LOCAL_OWNER, new=new,
                                   reuse_stale=reuse_stale))

    def cancel(self, sweep_id: str) -> dict[str, Any]:
        from upscale.control import sweeps

        return _dump(sweeps.cancel(self.services, sweep_id))

    def invalidate_segment(self, key: str) -> dict[str, Any]:
        from upscale.control import segments
        from upscale.control.services import LOCAL_OWNER

        return _dump(segments.invalidate(self.services, key, LOCAL_OWNER))

    def extend(self, sweep_id: str, additions: Mapping[str, Any], *, reuse_stale: bool = False) -> dict[str, Any]:
        from upscale.control import sweeps
        from upscale.control.services import LOCAL_OWNER

        return _dump(sweeps.extend(self.services, sweep_id, dict(additions), LOCAL_OWNER, reuse_stale))

    def observations_csv(self, sweep_id: str, kind: str | None = None) -> str:
        from upscale.control import sweeps
        from upscale.orchestrator.observations import table

        return table(sweeps.observations(self.services, sweep_id, kind)).to_csv(index=False)

    def observations(self, sweep_id: str, kind: str | None = None) -> pd.DataFrame:
        """Read back from the CSV, as `Client.observations` does: the same table, dtypes included."""
        import io

        import pandas as pd

        return pd.read_csv(io.StringIO(self.observations_csv(sweep_id, kind)))

    def suggest(self, sweep_id: str, budget_flops: float, n1: float | None = None, tolerance: float | None = None,
                apply: bool = False, study: str | None = None) -> dict[str, Any]:
        from upscale.control.schemas import SuggestRequest
        from upscale.control.services import LOCAL_OWNER
        from upscale.control.suggest import SuggestError, suggest

        body = SuggestRequest(budget_flops=budget_flops, n1=n1, tolerance=tolerance, apply=apply, study=study)
        with _user_errors():
            try:
                return _dump(suggest(self.services, sweep_id, body, LOCAL_OWNER))
            except SuggestError as e:  # the API's 422 at body.budget_flops (body.study), in the CLI's words
                raise CommandError(str(e).replace(e.field, f"--{e.field.replace('_', '-')}", 1)) from None

    # -- analyses and decisions --------------------------------------------------------------------------------

    def _plots(self, record: Any) -> dict[str, str]:
        """An analysis's plots as the API lists them, each name with where its PNG is (a path here, not a URL)."""
        from upscale.control.analyses import analysis_dir

        folder = analysis_dir(self.services.settings.home, record.id)
        return {p: str(folder / f"{p}.png") for p in record.plots}

    def analyze(self, sweep_id: str, n1s: list[float] | None = None, bootstrap: int | None = None,
                seed: int = 0, curves: bool = True) -> dict[str, Any]:
        """As POST /sweeps/{id}/analysis, with a bar per stage on stderr."""
        from upscale.api.cli.progress import stage_bars, workers_for
        from upscale.control import analyses
        from upscale.control.schemas import DEFAULT_ANALYSIS_BOOTSTRAP
        from upscale.control.services import LOCAL_OWNER

        n_boot = DEFAULT_ANALYSIS_BOOTSTRAP if bootstrap is None else bootstrap
        with _user_errors(), stage_bars() as progress:
            record = analyses.run_analysis(self.services, [sweep_id], n1s=n1s, bootstrap=n_boot, seed=seed,
                                           owner=LOCAL_OWNER, trigger="request", progress=progress,
                                           workers=workers_for(n_boot), curves=curves)
        return _dump(analyses.public(record, self._plots(record)))

    def analyses(self, sweep_id: str | None = None) -> list[dict[str, Any]]:
        from upscale.control import analyses

        if sweep_id is not None:
            self.services.store.sweep(sweep_id)
        return [_dump(analyses.public(r, self._plots(r) if r.sweep_ids else {}))
                for r in analyses.analyses(self.services.store, sweep_id)]

    def analysis_plot(self, sweep_id: str, name: str, analysis_id: str | None = None) -> bytes:
        from upscale.control.analyses import analysis_dir, latest_analysis
        from upscale.control.records import AnalysisRecord

        if analysis_id is None:
            record = latest_analysis(self.services.store, sweep_id)
        else:
            with self.services.store.transaction() as s:
                record = s.get(AnalysisRecord, analysis_id)
        stem = name.rpartition(".")[0]
        if record is None or stem not in record.plots:
            raise CommandError(f"sweep {sweep_id} has no analysis plot {name!r}")
        return (analysis_dir(self.services.settings.home, record.id) / name).read_bytes()

    def decide(self, n1: float, d1: float, d2: float, sweep_id: str | None = None,
               group: str | None = None) -> dict[str, Any]:
        from upscale.control import analyses

        with _user_errors():
            return _dump(analyses.decision(self.services, n1, d1, d2, sweep_id, group))

    def decide_expand(self, n1: float, d1: float, d2: float, sweep_id: str | None = None,
                      study: str | None = None) -> dict[str, Any]:
        from upscale.control import analyses

        with _user_errors():
            return _dump(analyses.expansion_decision(self.services, n1, d1, d2, sweep_id, study))

    # -- refits ------------------------------------------------------------------------------------------------

    def refit_schedules(self, include_deleted: bool = False) -> list[dict[str, Any]]:
        from upscale.control import refits
        from upscale.control.schemas import RefitSchedulePublic

        return [_dump(RefitSchedulePublic.model_validate(r, from_attributes=True))
                for r in refits.schedules(self.services, active_only=not include_deleted)]

    def create_refit_schedule(self, name: str, request: Mapping[str, Any], trigger: str = "on_new_observations",
                              cron: str | None = None) -> dict[str, Any]:
        from pydantic import ValidationError

        from upscale.control import refits
        from upscale.control.schemas import RefitScheduleCreate, RefitSchedulePublic
        from upscale.control.services import LOCAL_OWNER

        try:
            body = RefitScheduleCreate.model_validate({"name": name, "trigger": trigger, "cron": cron,
                                                       "request": dict(request)})
        except ValidationError as e:  # the API's 422, each problem at its field path
            raise CommandError("; ".join(f"{'.'.join(map(str, err['loc'])) or '<body>'}: {err['msg']}"
                                         for err in e.errors())) from None
        return _dump(RefitSchedulePublic.model_validate(refits.create_schedule(self.services, body, LOCAL_OWNER),
                                                        from_attributes=True))

    def _schedule(self, schedule_id: str) -> Any:
        from upscale.control import refits

        schedule = refits.get_schedule(self.services, schedule_id)
        if schedule is None:
            raise CommandError(f"no refit schedule {schedule_id!r}: `upscale refit schedule list --all` lists them")
        return schedule

    def delete_refit_schedule(self, schedule_id: str) -> None:
        from upscale.control import refits

        refits.deactivate(self.services, self._schedule(schedule_id).id)

    def run_refit(self, schedule_id: str) -> dict[str, Any]:
        from upscale.control import refits

        schedule = self._schedule(schedule_id)
        with _user_errors():
            return _dump(refits.run_answer(refits.run_refit(self.services, schedule, force=True)))

    def refits(self, schedule_id: str | None = None) -> list[dict[str, Any]]:
        from upscale.control import refits
        from upscale.control.schemas import RefitPublic

        return [_dump(RefitPublic.model_validate(r, from_attributes=True))
                for r in refits.refits(self.services, schedule_id)]


def connect(api: str | None, token: str | None) -> Client | Local:
    """`upscale.Client` to the server at ``api`` (with ``token``); without ``api``, `Local` on this machine's store."""
    return Client(api, token) if api else Local()
