"""What an analysis was asked with, kept on its record (`Analysis.settings`), so that two answers for the same data
say why they differ.

Every entry point runs fitting/analysis.py's `analyze`: the service's analyses (a request, the analysis loop,
refits), `upscale analyze` of a sweep or of tables, `upscale demo` and ``upscale.analyze``. For the same observations
they answer alike when these agree: the bootstrap count and seed (the intervals' draws), the N1s asked, and which
rows are fitted: the observed decays alone, or with the decay ends predicted from trunk curves (a sweep's analysis
by default, `--no-curves` leaves them out; tables carry them as rows marked ``source`` = predicted, which
`upscale analyze SWEEP --export-tables` writes). ``source`` names where the observations came from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pandas as pd

from upscale.fitting.curve_observations import is_predicted

if TYPE_CHECKING:  # no cycle: the fitting stack loads where analyses run, not where settings are compared
    from upscale.fitting.analysis import Analysis

COMPARED = ("curves", "predicted_rows", "bootstrap", "seed", "n1s")  # what changes the answer; source does not


def sweep_source(sweep_ids: Sequence[str]) -> str:
    """``source`` for a sweep's observations (several: each named), or "tables" for data in no sweep."""
    if not sweep_ids:
        return "tables"
    return f"sweep{'s' if len(sweep_ids) > 1 else ''} {', '.join(sweep_ids)}"


def with_settings(analysis: Analysis, source: str, tables: Mapping[str, pd.DataFrame]) -> Analysis:
    """``analysis`` with its ``settings``: ``source``, bootstrap, seed, n1s, and how many of the rows fitted
    (``tables``, or the record's curves when the analysis predicted them itself) were predicted from curves."""
    if analysis.curves:
        predicted = sum((analysis.curves.get("points") or {}).values())
    else:
        predicted = sum(int(is_predicted(df).sum()) for df in tables.values())
    return replace(analysis, settings={"source": source, "curves": predicted > 0, "predicted_rows": predicted,
                                       "bootstrap": analysis.bootstrap, "seed": analysis.seed,
                                       "n1s": list(analysis.n1s)})


def differences(settings: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The settings that change the answer where ``other`` differs from ``settings``: name -> (theirs, ours)."""
    return {k: (other.get(k), settings.get(k)) for k in COMPARED if other.get(k) != settings.get(k)}
