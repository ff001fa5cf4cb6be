"""Expert upcycling as the paper's three tables: an E-expert MoE (the parent, trained from scratch D1 tokens)
expanded to m·E experts (top-k unchanged) and trained D2 more is dense->MoE upcycling one step later, so each
expansion study maps onto the arms `analyze` already takes (docs/laws.md, "Expansion"):

- "dense" <- the parent's own runs: the from-scratch rows with E experts, top-k k (D, N = N1);
- "scratch" <- the rival: the from-scratch rows with m·E experts, top-k k;
- "upcycled" <- the study's "expanded" rows (D1 the parent's tokens, D2 those after expansion, N1).

Its D* is D*_expand: past it the m·E MoE from scratch wins at the same sunk cost. A study is one parent E x k,
factor m, strategy (the rows' ``method``) and Drop-Upcycling ratio r; one lacking an arm is kept, not analysed,
with what to add. Pure table work: fitting/analysis.py runs the analysis on the studies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from upscale.fitting.curve_observations import is_predicted
from upscale.fitting.groups import group_label
from upscale.fitting.laws import LOSS
from upscale.fitting.summary import group_keys

EXPANDED = "expanded"  # the observation kind of runs trained after an expansion
STUDY_COLUMNS = ("parent_experts", "n_expert", "topk", "method", "r")
ARMS = {"dense": "parent", "scratch": "from scratch", "upcycled": "expanded"}  # what each mapped table holds


def _value(v: Any) -> Any:
    """A cell as the record keeps it: None for a missing one, ints for counts."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    return int(v) if isinstance(v, int | float) and float(v).is_integer() and not isinstance(v, bool) else v


def shape(experts: Any, topk: Any) -> str:
    """An expert configuration as people write it: ``8x1``; ``?`` for what the rows do not say."""
    return f"{experts if experts is not None else '?'}x{topk if topk is not None else '?'}"


def study_label(group: dict[str, Any]) -> str:
    """``expand 4x1 -> 8x1 uniform``, with ``r=0.5`` when the replicas were dropped: the study's name everywhere
    (record, plots' folder, MLflow), and its expanded rows' group label in the analysis it runs."""
    method = str(group.get("method") or "expand")
    strategy = method.removeprefix("expand-") if method.startswith("expand-") else method
    parts = [f"expand {shape(group.get('parent_experts'), group.get('topk'))} -> "
             f"{shape(group.get('n_expert'), group.get('topk'))} {strategy}"]
    return group_label({"method": parts[0], "r": group.get("r")})


@dataclass(frozen=True)
class Study:
    """One expansion study: its group, the three tables `analyze` takes (the expanded rows' ``method`` made the
    study's label, so that every fit and problem of its analysis names it) and, when an arm is empty, what it
    lacks ({"arm", "why", "add"})."""

    group: dict[str, Any]
    tables: dict[str, pd.DataFrame]
    missing: list[dict[str, str]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return study_label(self.group)

    @property
    def points(self) -> dict[str, int]:
        return {ARMS[k]: len(df) for k, df in self.tables.items()}


def _configs(df: pd.DataFrame) -> list[tuple[float, float]]:
    """Each row's expert configuration (n_expert, topk), as numbers (NaN where a row does not say)."""
    return list(zip(pd.to_numeric(df["n_expert"], errors="coerce"), pd.to_numeric(df["topk"], errors="coerce"),
                    strict=True))


def _rows_of(df: pd.DataFrame, configs: set[tuple[Any, Any]]) -> pd.DataFrame:
    """The rows of ``df`` whose configuration is one of ``configs``, every column kept (an empty table too)."""
    return df[pd.Series([c in configs for c in _configs(df)], index=df.index, dtype=bool)].reset_index(drop=True)


def _scratch_rows(scratch: pd.DataFrame, experts: Any, topk: Any) -> pd.DataFrame:
    """The from-scratch rows of one expert configuration; none when the table does not say its configurations."""
    if experts is None or topk is None or not {"n_expert", "topk"} <= set(scratch.columns):
        return scratch.iloc[0:0]
    return _rows_of(scratch, {(experts, topk)})


def upcycling_configs(scratch: pd.DataFrame, tables: Mapping[str, pd.DataFrame]) -> set[tuple[float, float]] | None:
    """The expert configurations (n_expert, topk) whose from-scratch rows the dense->MoE analysis of ``tables``
    measures its upcycled groups against: with expanded rows present, those its upcycled rows have (an expanded MoE's
    rival, or a parent grown in no dense upcycling, is left out). None, every row counting, without expanded rows or
    without configurations in ``scratch`` and the upcycled rows to tell them by."""
    expanded, upcycled = tables.get(EXPANDED), tables.get("upcycled")
    columns = {"n_expert", "topk"}
    if expanded is None or expanded.empty or upcycled is None or upcycled.empty \
            or not (columns <= set(scratch.columns) and columns <= set(upcycled.columns)):
        return None
    return set(_configs(upcycled))


def upcycling_scratch(scratch: pd.DataFrame, tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """``scratch`` (observed from-scratch rows, or rows predicted from trunk curves) for the dense->MoE analysis of
    ``tables``: the rows of `upcycling_configs`, so that no other configuration's ever joins the from-scratch law the
    upcycled groups are measured against."""
    keep = upcycling_configs(scratch, tables)
    return scratch if keep is None else _rows_of(scratch, keep)


def upcycling_tables(tables: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """``tables`` with the from-scratch table ``upcycling_scratch`` keeps."""
    if "scratch" not in tables:
        return dict(tables)
    return {**tables, "scratch": upcycling_scratch(tables["scratch"], tables)}


def _missing(group: dict[str, Any], parent: pd.DataFrame, rival: pd.DataFrame,
             scratch: pd.DataFrame) -> list[dict[str, str]]:
    """What keeps a study from being analysed, arm by arm, with what to add."""
    e, me, k = group.get("parent_experts"), group.get("n_expert"), group.get("topk")
    out = []
    if e is None:
        out.append({"arm": "parent", "why": "the expanded rows do not say how many experts their parent had "
                                            "(parent_experts)",
                    "add": "parent_experts on every expanded row"})
    no_shapes = "" if {"n_expert", "topk"} <= set(scratch.columns) else (
        " (the from-scratch table has no n_expert and topk columns to tell configurations apart)")
    if e is not None and parent.empty:
        out.append({"arm": "parent", "why": f"no from-scratch runs of the {shape(e, k)} parent{no_shapes}",
                    "add": f"from-scratch {shape(e, k)} runs at the parent's sizes over several budgets D"})
    if rival.empty:
        out.append({"arm": "from scratch", "why": f"no from-scratch runs of the {shape(me, k)} MoE{no_shapes}",
                    "add": f"from-scratch {shape(me, k)} runs at the same sizes over several budgets D"})
    return out


def _observed(df: pd.DataFrame | None) -> pd.DataFrame:
    """The rows with a measured loss: not decay ends predicted from curves, which a study does not fit."""
    if df is None or LOSS not in df.columns:
        return pd.DataFrame(columns=[LOSS])
    return df[~is_predicted(df)].dropna(subset=[LOSS]).reset_index(drop=True)


def expansion_studies(tables: dict[str, pd.DataFrame]) -> list[Study]:
    """The studies in ``tables`` ("scratch" and "expanded"; none without expanded rows), in a stable order, on
    their observed rows."""
    expanded = _observed(tables.get(EXPANDED))
    if expanded.empty:
        return []
    scratch = _observed(tables.get("scratch"))
    for c in STUDY_COLUMNS:
        if c not in expanded.columns:
            expanded[c] = None
    by = [c for c in STUDY_COLUMNS if expanded[c].notna().any()]
    parts = group_keys(expanded, by) if by else [({}, expanded)]
    out = []
    for key, rows in parts:
        group = {c: _value(key.get(c)) for c in STUDY_COLUMNS}
        parent = _scratch_rows(scratch, group["parent_experts"], group["topk"])
        rival = _scratch_rows(scratch, group["n_expert"], group["topk"])
        up = rows.drop(columns=["n_expert", "topk", "parent_experts"]).assign(method=study_label(group))
        out.append(Study(group, {"dense": parent, "scratch": rival, "upcycled": up.reset_index(drop=True)},
                         _missing(group, parent, rival, scratch)))
    return out
