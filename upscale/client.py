"""`upscale.Client`: the REST API of a running `upscale serve` from Python, and the CLI's `--api` path.

One method per thing the API offers (sweeps, observations, analyses, fits, decisions, refit schedules, health),
returning the API's JSON as plain dicts and lists (observations as a pandas DataFrame or CSV text). Every failure a
caller can cause or fix (server not running, no answer, no or wrong token, scope, unknown id, invalid body) raises
one type, `ApiError`, whose message says what to do; the CLI prints it as one `error:` line.

httpx and pandas are imported when first needed, so `import upscale.client` costs nothing (the CLI imports this
module for `ApiError` on every start).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import httpx
    import pandas as pd

    from upscale.sweeps.spec import SweepSpec

DEFAULT_TIMEOUT_S = 120.0  # what an ordinary request waits for its answer
# A heavy request (a fit, a refit run, a suggestion, a submission or extension to plan) answers only once computed:
# the server starts it within UPSCALE_HEAVY_WAIT_S (60 s by default) or refuses it (429), and the costliest the caps
# allow, a refit at bootstrap 500, took 133-146 s with four at once on two cores (~70 s with the server's two heavy
# threads): a minute's wait and twice that computing, with room to spare.
HEAVY_TIMEOUT_S = 300.0
TOKEN_HINT = "pass a token: --token or UPSCALE_TOKEN (Client(token=...) in Python; `upscale token create` prints one)"
Kind = Literal["dense", "upcycled", "scratch"]  # the tables a law is fitted on
ObservationKind = Literal["dense", "upcycled", "scratch", "expanded"]


class ApiError(RuntimeError):
    """A request that failed for a reason its caller can fix; ``status`` is the HTTP status, None if none came."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _timeout_from_env() -> float | None:
    raw = os.environ.get("UPSCALE_TIMEOUT", "")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ApiError(f"UPSCALE_TIMEOUT={raw!r}: give the seconds to wait for the server, e.g. 60")
    return value


def _detail(r: httpx.Response) -> str:
    """The server's `detail` on one line: a 422's problems as `field.path: message`, joined by '; '."""
    if r.headers.get("content-type", "").startswith("application/json"):
        try:
            detail = r.json().get("detail", r.text)
        except (ValueError, AttributeError):  # not a JSON object after all
            detail = r.text
    else:
        detail = r.text
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])[1:])) or '<body>'}: {d.get('msg')}"
                           if isinstance(d, dict) else str(d) for d in detail)
    return " ".join(str(detail).split())[:500]  # one line, even for an HTML error page


class Client:
    """A connection to the upscale REST API at ``url`` (e.g. ``http://127.0.0.1:8000``).

    ``token`` defaults to the environment variable UPSCALE_TOKEN; every route but ``health`` needs one (scope
    `write` for submit, cancel, fits and refits). ``timeout`` (seconds) defaults to UPSCALE_TIMEOUT, else 120 for
    an ordinary request and HEAVY_TIMEOUT_S for a heavy one (a fit, a refit run, a suggestion, a submission). ``http``
    sends through an existing httpx client instead (e.g. Starlette's TestClient, to reach an app in-process). Use it
    as a context manager, or call ``close()``.
    """

    def __init__(self, url: str, token: str | None = None, timeout: float | None = None, *,
                 http: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("UPSCALE_TOKEN") or None
        given = timeout if timeout is not None else _timeout_from_env()
        self.timeout = given or DEFAULT_TIMEOUT_S
        self.heavy_timeout = given or HEAVY_TIMEOUT_S
        if http is None:
            import httpx

            try:
                http = httpx.Client(base_url=self.url, timeout=self.timeout)
            except httpx.InvalidURL as e:
                raise ApiError(f"{url!r} is not a URL ({e}); give one like http://127.0.0.1:8000") from None
        self.http = http

    def __enter__(self) -> Client:
        self.http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.__exit__(*exc)

    def close(self) -> None:
        self.http.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r}, token={'set' if self.token else None})"

    # -- transport ---------------------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, raw: bool = False, heavy: bool = False, **kwargs: Any) -> Any:
        """Send one request; the JSON (or text, e.g. CSV; bytes with ``raw``) of a success, None for an empty one;
        else ApiError. A ``heavy`` one waits `heavy_timeout` for its answer."""
        import httpx

        timeout = self.heavy_timeout if heavy else self.timeout
        if heavy:
            kwargs["timeout"] = timeout
        if self.token:
            kwargs["headers"] = {"Authorization": f"Bearer {self.token}", **kwargs.get("headers", {})}
        where = f"{method} {path}"
        try:
            r = self.http.request(method, path, **kwargs)
        except httpx.ConnectError as e:
            raise ApiError(f"cannot connect to {self.url} ({e}); is `upscale serve` running at {self.url}?") from None
        except httpx.TimeoutException:
            raise ApiError(f"{where}: no answer within {timeout:g} s; is {self.url} the upscale API and "
                           f"`upscale serve` healthy there? (UPSCALE_TIMEOUT or timeout= waits longer)") from None
        except httpx.UnsupportedProtocol:
            raise ApiError(f"{self.url!r} is not an http(s) URL; give one like http://127.0.0.1:8000") from None
        except httpx.TransportError as e:
            raise ApiError(f"{where}: {type(e).__name__}: {e}; is {self.url} the upscale API?") from None
        if r.status_code >= 400:
            raise ApiError(self._explain(r, where), r.status_code)
        if raw:
            return r.content
        if not r.content:
            return None
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text

    def _explain(self, r: httpx.Response, where: str) -> str:
        status, detail = r.status_code, _detail(r)
        message = f"{where} -> {status}: {detail}"
        if status == 401:
            return f"{message}; " + (f"the token is not one this server issued, or it was revoked or has expired: "
                                     f"{TOKEN_HINT}" if self.token else TOKEN_HINT)
        if status == 403 and "has scope" in detail:  # not an ownership refusal, whose detail says whose it is
            needed = "admin" if detail.endswith("needs 'admin'") else "write"
            return f"{message}; use a token of scope {needed!r} (`upscale token create --scope {needed}`)"
        if status == 404 and detail == "Not Found":  # FastAPI's own answer: no such route, not no such sweep
            return f"{message}; is {self.url} the upscale API?"
        if status == 503:  # the server works but something it needs is down (Ray restarting): the detail says what
            return message
        if status >= 500:
            return f"{message}; the server failed: its log has the traceback"
        return message

    # -- operations --------------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """{status: ok, scheduler: whether the server also trains sweeps, loops: each background loop's liveness, ray:
        what is wrong with Ray or null}; needs no token. ApiError (503) with that report when a loop or Ray is down."""
        return self.request("GET", "/healthz")

    # -- sweeps ------------------------------------------------------------------------------------------------

    def sweeps(self) -> list[dict[str, Any]]:
        """Every sweep, oldest first, with its status, owner and segments done."""
        return self.request("GET", "/sweeps")

    def sweep(self, sweep_id: str) -> dict[str, Any]:
        """A sweep's status, each segment's state, and FLOPs done vs planned."""
        return self.request("GET", f"/sweeps/{sweep_id}")

    def submit(self, spec: str | os.PathLike[str] | Mapping[str, Any] | SweepSpec, *, new: bool = False,
               reuse_stale: bool = False) -> dict[str, Any]:
        """Submit a sweep spec: a path to its YAML/JSON file, a mapping, or a parsed SweepSpec. Returns
        {id, name, status, owner, plan, existing, reuse_stale}: a spec identical to one of your sweeps returns that
        sweep (``existing`` true) unless ``new``; segments trained under an older training-semantics version
        (``plan.stale_segments``) are retrained unless ``reuse_stale``. An invalid spec raises ApiError naming each
        field."""
        params = {k: "true" for k, on in (("new", new), ("reuse_stale", reuse_stale)) if on} or None
        if isinstance(spec, str | os.PathLike):
            path = Path(spec)
            kind = "application/json" if path.suffix == ".json" else "application/yaml"
            return self.request("POST", "/sweeps", content=path.read_bytes(), headers={"content-type": kind},
                                params=params, heavy=True)
        body = spec.model_dump(mode="json") if hasattr(spec, "model_dump") else dict(spec)
        return self.request("POST", "/sweeps", json=body, params=params, heavy=True)

    def cancel(self, sweep_id: str) -> dict[str, Any]:
        """Stop a sweep: running segments are released (they resume if it is submitted again)."""
        return self.request("POST", f"/sweeps/{sweep_id}/cancel")

    def invalidate_segment(self, key: str) -> dict[str, Any]:
        """Mark a done segment and every segment trained from it for retraining (its checkpoint is corrupt or
        lost); an admin token. Returns {key, segments, sweeps, by}; 409 while one of them is running."""
        return self.request("POST", f"/segments/{key}/invalidate")

    def extend(self, sweep_id: str, additions: Mapping[str, Any], *, reuse_stale: bool = False) -> dict[str, Any]:
        """A new sweep whose spec is this one's plus ``additions`` (lists unioned): only new segments train."""
        return self.request("POST", f"/sweeps/{sweep_id}/extend",
                            json={"additions": dict(additions), "reuse_stale": reuse_stale}, heavy=True)

    def suggest(self, sweep_id: str, budget_flops: float, n1: float | None = None, tolerance: float | None = None,
                apply: bool = False, study: str | None = None) -> dict[str, Any]:
        """Grid extensions ranked by the expected shrinkage of the D* interval at ``n1`` per FLOP (of ``study``'s
        D*_expand, with an expansion study's label), chosen within ``budget_flops`` from the sweep's newest analysis;
        ``apply`` submits them as a sweep (a write token)."""
        return self.request("POST", f"/sweeps/{sweep_id}/suggest",
                            json={"budget_flops": budget_flops, "n1": n1, "tolerance": tolerance, "apply": apply,
                                  "study": study}, heavy=True)

    def observations_csv(self, sweep_id: str, kind: ObservationKind | None = None) -> str:
        """A sweep's observations as the CSV `upscale fit --data` reads (only one kind's rows with ``kind``)."""
        return self.request("GET", f"/sweeps/{sweep_id}/observations",
                            params={"format": "csv", **({"kind": kind} if kind else {})})

    def observations(self, sweep_id: str, kind: ObservationKind | None = None) -> pd.DataFrame:
        """A sweep's observations as a DataFrame: one row per finished decay segment."""
        import io

        import pandas as pd

        return pd.read_csv(io.StringIO(self.observations_csv(sweep_id, kind)))

    # -- fits and decisions ------------------------------------------------------------------------------------

    def fits(self) -> list[dict[str, Any]]:
        """Every stored fit, oldest first."""
        return self.request("GET", "/fits")

    def fit(self, fit_id: str) -> dict[str, Any]:
        """A stored fit: its report (params, intervals, LOO RMS), request and plot URLs."""
        return self.request("GET", f"/fits/{fit_id}")

    def create_fit(self, law: str, kind: Kind, sweep_ids: list[str] | None = None,
                   rows: list[dict[str, Any]] | None = None, fixed: Mapping[str, float] | None = None,
                   bootstrap: int = 0) -> dict[str, Any]:
        """Fit ``law`` on the sweeps' observations of ``kind``, or on inline ``rows``; the stored fit."""
        body = {"law": law, "kind": kind, "sweep_ids": sweep_ids or [], "rows": rows, "fixed": dict(fixed or {}),
                "bootstrap": bootstrap}
        return self.request("POST", "/fits", json=body, heavy=True)

    def decide(self, n1: float, d1: float, d2: float, sweep_id: str | None = None,
               group: str | None = None) -> dict[str, Any]:
        """Upcycle or train from scratch: from the newest analysis (of ``sweep_id``, if given; of ``group``'s law,
        default the best one there), named in the answer with its age. ApiError with status 409 when nothing can
        answer yet, saying what is missing."""
        params = {"n1": n1, "d1": d1, "d2": d2, "sweep_id": sweep_id, "group": group}
        return self.request("GET", "/decisions/upcycle", params={k: v for k, v in params.items() if v is not None})

    def decide_expand(self, n1: float, d1: float, d2: float, sweep_id: str | None = None,
                      study: str | None = None) -> dict[str, Any]:
        """Expand an E-expert MoE trained D1 tokens and train it D2 more, or train the m·E MoE from scratch: as
        ``decide``, for an expansion study of the newest analysis (``study``, default the best one there)."""
        params = {"n1": n1, "d1": d1, "d2": d2, "sweep_id": sweep_id, "study": study}
        return self.request("GET", "/decisions/expand", params={k: v for k, v in params.items() if v is not None})

    # -- analyses ----------------------------------------------------------------------------------------------

    def analyze(self, sweep_id: str, n1s: list[float] | None = None, bootstrap: int | None = None,
                seed: int = 0, poll_s: float = 1.0, curves: bool = True) -> dict[str, Any]:
        """Run the paper's analysis on a sweep now and wait for it (identical inputs: the existing one, or the one
        running); the stored analysis: its record (fits, D*, verdicts, problems) and plot URLs. The server runs it
        in the background; this polls it every ``poll_s`` and raises ApiError if it failed. ``bootstrap``
        defaults to the server's; ``curves`` False: observed decays only (no predicted ones from trunk curves)."""
        import re
        import time

        body: dict[str, Any] = {"n1s": n1s, "seed": seed, "curves": curves}
        if bootstrap is not None:
            body["bootstrap"] = bootstrap
        try:
            record = self.request("POST", f"/sweeps/{sweep_id}/analysis", json=body)
        except ApiError as e:  # these inputs are being analysed by another request: wait for that one
            running = re.search(r"analysis (\w+) of these inputs is running", str(e))
            if e.status != 409 or running is None:
                raise
            record = self.request("GET", f"/analyses/{running.group(1)}")
        while record["status"] == "running":
            time.sleep(poll_s)
            record = self.request("GET", f"/analyses/{record['id']}")
        if record["status"] == "failed":
            raise ApiError(f"analysis {record['id']} of sweep {sweep_id} failed: {record['error']}", 422)
        return record

    def analysis(self, sweep_id: str) -> dict[str, Any]:
        """A sweep's latest finished analysis; ApiError 409 (saying why) when there is none yet."""
        return self.request("GET", f"/sweeps/{sweep_id}/analysis")

    def analyses(self, sweep_id: str | None = None) -> list[dict[str, Any]]:
        """Analyses newest first, running and failed ones too: every sweep's, or those including ``sweep_id``."""
        return self.request("GET", f"/sweeps/{sweep_id}/analyses" if sweep_id else "/analyses")

    def analysis_plot(self, sweep_id: str, name: str, analysis_id: str | None = None) -> bytes:
        """One plot of a sweep's analysis (the latest, or ``analysis_id``): ``name`` as listed, plus .png or .pdf."""
        return self.request("GET", f"/sweeps/{sweep_id}/analysis/plots/{name}", raw=True,
                            params={"analysis_id": analysis_id} if analysis_id else {})

    # -- refits ------------------------------------------------------------------------------------------------

    def refit_schedules(self, include_deleted: bool = False) -> list[dict[str, Any]]:
        """Refit schedules (active ones unless ``include_deleted``), every owner's."""
        return self.request("GET", "/refit-schedules", params={"all": include_deleted})

    def create_refit_schedule(self, name: str, request: Mapping[str, Any], trigger: str = "on_new_observations",
                              cron: str | None = None) -> dict[str, Any]:
        """Rerun the analysis of ``request`` ({sweep_ids, bootstrap (default 100), n1 (default: the largest size
        trained)}) whenever the sweeps' observations change, or on a 5-field UTC ``cron`` with trigger="cron"."""
        return self.request("POST", "/refit-schedules",
                            json={"name": name, "trigger": trigger, "cron": cron, "request": dict(request)})

    def delete_refit_schedule(self, schedule_id: str) -> None:
        """Stop a schedule; its refits are kept."""
        self.request("DELETE", f"/refit-schedules/{schedule_id}")

    def run_refit(self, schedule_id: str) -> dict[str, Any]:
        """Refit now: the new version (D*, its interval, whether it left the previous one), or the latest version
        with ``unchanged`` true when the observations have not changed since it."""
        return self.request("POST", f"/refit-schedules/{schedule_id}/run", heavy=True)

    def refits(self, schedule_id: str | None = None) -> list[dict[str, Any]]:
        """Every refit version, oldest first (of one schedule with ``schedule_id``)."""
        return self.request("GET", "/refits", params={"schedule_id": schedule_id} if schedule_id else {})
