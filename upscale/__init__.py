"""upscale: should a trained dense LM be upcycled into a Mixture-of-Experts, or the MoE trained from scratch?

The packages live under this one namespace: ``upscale.sweeps`` (specs and the planner), ``upscale.workers``
(training segments), ``upscale.orchestrator`` (store, scheduler, MLflow), ``upscale.fitting`` (laws, fits, D*),
``upscale.control`` (what the service's faces share) and ``upscale.api`` (REST service and CLI). This module is
the Python API for notebooks: thin wrappers over those packages (the same code as the CLI), imported on first use
so that ``import upscale`` stays light.

A notebook session on the bundled SYNTHETIC tables (generated from the paper's Table 2 parameters)::

    import upscale
    from upscale.fitting.synthetic import bundled_path   # fitting/data/synthetic-{dense,moe,upcycled}.csv

    moe = upscale.fit("chinchilla", bundled_path("moe"), fixed={"E": 0.165}, bootstrap=50)
    up = upscale.fit("joint", bundled_path("upcycled"), fixed={"E": 0.165}, bootstrap=50)
    moe.params, up.report["ci"]                                   # values, 95% intervals
    upscale.dstar(moe, up, n1=1e9)["results"][0]["dstar"]         # ~3e9 tokens, as the paper's
    d = upscale.decide(moe, up, n1=1e9, d1=1e9, d2=1e9)
    d.verdict, d.probability_upcycle                              # "upcycle", 1.0

    # the whole analysis, as `upscale demo --synthetic` runs it: E shared, then fixed in the other fits
    tables = {k: bundled_path(f) for k, f in (("dense", "dense"), ("scratch", "moe"), ("upcycled", "upcycled"))}
    analysis = upscale.analyze(tables, n1s=[1e8, 1e9, 7e9], bootstrap=50)
    analysis.E, analysis.upcycled[0].dstar["results"]

On a machine that ran sweeps, ``upscale.load_observations(sweep_id, kind="upcycled")`` reads a sweep's table from
the local store (the sweep id may be left out when the store holds one sweep); printing a fit, an analysis or a
verdict shows a short summary (``_repr_html_`` in Jupyter); ``upscale.Client(url, token)`` talks to a running
`upscale serve`.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import pandas as pd

    from upscale.fitting.analysis import Analysis, LawFit, Progress
    from upscale.fitting.dstar import UpcycleDecision
    from upscale.fitting.laws import Law
    from upscale.fitting.summary import FittedLaw

try:
    __version__ = version("upscale")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["Analysis", "Client", "LawFit", "__version__", "analyze", "decide", "dstar", "fit", "load_observations",
           "read_observations"]

# Names resolved on first use (module-level __getattr__): the client pulls httpx, the types pull numpy and pandas.
_LAZY = {"Client": "upscale.client", "Analysis": "upscale.fitting.analysis", "LawFit": "upscale.fitting.analysis"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'upscale' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def load_observations(sweep_id: str | None = None, kind: str | None = None,
                      home: str | Path | None = None) -> pd.DataFrame:
    """A sweep's observations from the local store, as `upscale observations SWEEP --csv` gives them.

    ``sweep_id``: required when the store holds several sweeps (the error lists them), else its only sweep. ``kind``:
    dense, scratch or upcycled (default all, with a ``kind`` column). ``home``: the UPSCALE_HOME to read (default
    the environment's, else ./.upscale). The frame names the sweep it came from: ``.attrs["sweep_id"]`` and
    ``.attrs["sweep_name"]``.
    """
    from upscale.orchestrator.errors import NotFoundError
    from upscale.orchestrator.observations import table
    from upscale.orchestrator.settings import Settings, get_settings
    from upscale.orchestrator.store import Store

    settings = Settings(home=Path(home)) if home is not None else get_settings()
    store = Store(settings.db_url)
    if sweep_id is None:
        sweeps = store.sweeps()
        if not sweeps:
            raise NotFoundError(f"no sweep in the store under {settings.home}; run `upscale demo` or `upscale run`")
        if len(sweeps) > 1:
            listed = "; ".join(f"{s.id} ({s.name}, {s.status})" for s in reversed(sweeps[-10:]))
            raise ValueError(f"the store under {settings.home} holds {len(sweeps)} sweeps: pass sweep_id= one of "
                             f"them (newest first: {listed})")
        sweep_id = sweeps[0].id
    sweep = store.sweep(sweep_id)
    out = table(store.observations(sweep.id), kind)
    out.attrs.update(sweep_id=sweep.id, sweep_name=sweep.name)
    return out


def read_observations(csv: str | Path) -> pd.DataFrame:
    """A CSV of observations (a law's columns, ``loss``, optional ``trunk``; '#' lines are comments)."""
    from upscale.fitting.data import read_table

    return read_table(csv)


def _table(data: pd.DataFrame | str | Path) -> pd.DataFrame:
    return data if hasattr(data, "columns") else read_observations(data)


# The law `analyze` fits to each table: its columns and ``loss`` are what a table must have.
_ANALYSIS_LAWS = {"dense": "chinchilla", "scratch": "chinchilla", "upcycled": "joint", "expanded": "joint"}


def _analysis_table(kind: str, data: pd.DataFrame | str | Path) -> pd.DataFrame:
    """One of `analyze`'s tables, read if a path; FitError naming the file (or table) and the columns it lacks."""
    from upscale.fitting.errors import FitError
    from upscale.fitting.laws import LOSS, get_law

    df = _table(data)
    needed = [*get_law(_ANALYSIS_LAWS[kind]).columns, LOSS] if kind in _ANALYSIS_LAWS else []
    missing = [c for c in needed if c not in df.columns]
    if missing:
        where = str(data) if not hasattr(data, "columns") else f"the {kind} table"
        raise FitError(f"{where}: the {kind} table needs column(s) {', '.join(missing)} (it has "
                       f"{', '.join(map(str, df.columns)) or 'none'})")
    return df


def _source(tables: Mapping[str, pd.DataFrame | str | Path]) -> str:
    """Where ``tables`` came from, as the analysis's settings name it: the folder of dense.csv, scratch.csv and
    upcycled.csv, else each file; the sweep `load_observations` read them from; else data frames."""
    paths = {k: Path(v) for k, v in tables.items() if not hasattr(v, "columns")}
    if paths and len(paths) == len(tables):
        folders = {p.parent for p in paths.values()}
        if len(folders) == 1 and all(p.name == f"{k}.csv" for k, p in paths.items()):
            return f"tables {folders.pop()}"
        return "tables " + ", ".join(f"{k}={p}" for k, p in paths.items())
    sweeps = sorted({str(v.attrs["sweep_id"]) for v in tables.values() if "sweep_id" in getattr(v, "attrs", {})})
    return f"sweep {', '.join(sweeps)} (its observation tables)" if sweeps else "tables (data frames)"


def fit(law: str | Law, data: pd.DataFrame | str | Path, fixed: dict[str, float] | None = None,
        bootstrap: int = 0, seed: int = 0, workers: int = 1) -> LawFit:
    """Fit ``law`` (a name of `upscale laws`) to a table or CSV, as `upscale fit`: summed Huber/BFGS from a grid of
    starts, LOO RMS, and with ``bootstrap`` refits (over trunks when the table has them) intervals and samples.

    Returns a ``LawFit``: ``.params``, ``.report`` (the `upscale fit --json` report) and ``.fitted`` (for D*).
    """
    from upscale.fitting.analysis import fit_law

    return fit_law(law, _table(data), fixed, bootstrap, seed, workers)


def analyze(tables: Mapping[str, pd.DataFrame | str | Path], n1s: Sequence[float] | None = None,
            decisions: Sequence[tuple[float, float, float]] | None = None, bootstrap: int | None = None,
            seed: int = 0, workers: int = 1, progress: Progress | None = None, curves: bool = True) -> Analysis:
    """The paper's analysis, as `upscale demo` and `upscale analyze` run it: E shared by the dense and from-scratch
    laws, the from-scratch and upcycled (per method, r) laws with E fixed, bootstrap, D* at ``n1s`` and verdicts for
    ``decisions``.

    ``tables``: "dense", "scratch" and "upcycled", as frames or CSV paths (FitError naming a missing file or
    column); and "expanded" for expert upcycling (the record's ``expansions``: D*_expand per expansion study).
    ``bootstrap``: default the service's (100), so that the same observations give the same answer here and from
    `upscale analyze`. ``curves`` False: rows the tables mark as predicted from trunk curves (``source``
    "predicted", as `upscale analyze SWEEP --export-tables` writes them) are left out, as `--no-curves` does. The
    record's ``settings`` say all of this. See ``upscale.fitting.analysis.analyze``.
    """
    from upscale.control.analysis_settings import with_settings
    from upscale.control.schemas import DEFAULT_ANALYSIS_BOOTSTRAP
    from upscale.fitting.analysis import analyze as run
    from upscale.fitting.curve_observations import is_predicted

    read = {k: _analysis_table(k, v) for k, v in tables.items()}
    if not curves:
        read = {k: df[~is_predicted(df)].reset_index(drop=True) for k, df in read.items()}
    n_boot = DEFAULT_ANALYSIS_BOOTSTRAP if bootstrap is None else bootstrap
    return with_settings(run(read, n1s, decisions, n_boot, seed, workers, progress), _source(tables), read)


def _fitted(f: LawFit | FittedLaw | dict | str | Path) -> FittedLaw:
    """A fit as D* takes it, from a ``LawFit``, a fitted law, a report dict or an `upscale fit --json` file."""
    from upscale.fitting.analysis import LawFit
    from upscale.fitting.summary import FittedLaw, fitted_law, load_fit

    if isinstance(f, LawFit):
        return f.fitted
    if isinstance(f, FittedLaw):
        return f
    return fitted_law(f) if isinstance(f, dict) else load_fit(f)


def dstar(moe_fit: LawFit | FittedLaw | dict | str | Path, upcycled_fit: LawFit | FittedLaw | dict | str | Path,
          n1: float | Sequence[float]) -> dict[str, Any]:
    """D* at each N1, as `upscale dstar --json`: every crossing, D*, its bootstrap interval, who wins where, and
    the closed form D*(N1). ``moe_fit``: a chinchilla fit of the from-scratch MoE; ``upcycled_fit``: a joint fit."""
    from upscale.fitting.dstar import dstar_results

    n1s = [float(n1)] if isinstance(n1, int | float) else [float(n) for n in n1]
    return dstar_results(_fitted(moe_fit), _fitted(upcycled_fit), n1s)


def decide(moe_fit: LawFit | FittedLaw | dict | str | Path, upcycled_fit: LawFit | FittedLaw | dict | str | Path,
           n1: float, d1: float, d2: float) -> UpcycleDecision:
    """Upcycle or train from scratch, as `upscale decide`: ``.verdict``, ``.catch_up_tokens`` and, when both fits
    were bootstrapped, ``.probability_upcycle`` (``.to_json()`` for the CLI's JSON)."""
    from upscale.fitting.dstar import decide as run

    return run(_fitted(moe_fit), _fitted(upcycled_fit), n1, d1, d2)
