"""The upcycling groups of an upcycled table: the paper fits its upcycled law once per method and drop ratio r, and
once per expert configuration (n_expert x topk), since each is a different model family. One set of names for the
analysis, its plots, `upscale plan`'s identifiability warnings and the service's records."""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

from upscale.fitting.summary import group_keys

GROUP_COLUMNS = ("method", "r", "n_expert", "topk")


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and value is not pd.NA


def group_label(group: dict[str, Any]) -> str:
    """A group as people read it: ``naive 8x2``, ``drop r=0.5 8x2``; ``naive`` without expert columns; empty for
    an ungrouped table."""
    method, r, e, k = (group.get(c) for c in GROUP_COLUMNS)
    if not _present(method):
        return ""
    parts = [str(method)] + ([f"r={float(r):g}"] if _present(r) else [])
    if _present(e) and _present(k):
        parts.append(f"{int(e)}x{int(k)}")
    return " ".join(parts)


def group_slug(group: dict[str, Any]) -> str:
    """``group_label`` as a file or folder name: ``naive_8x2``, ``drop_r0.5_8x2``; ``all`` for an ungrouped table."""
    return as_slug(group_label(group).replace("r=", "r")) or "all"


def as_slug(text: str) -> str:
    """``text`` as a file, folder or tag name part: every run of other characters than letters, digits and dots one
    underscore, none at either end (``upcycled naive 8x2`` -> ``upcycled_naive_8x2``)."""
    return re.sub(r"[^A-Za-z0-9.x]+", "_", text).strip("_")


def upcycled_groups(upcycled: pd.DataFrame) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """The upcycled table split by method, r, n_expert and topk (the columns it has values in); one group when it
    has none of them."""
    by = [c for c in GROUP_COLUMNS if c in upcycled.columns and upcycled[c].notna().any()]
    if not by:
        return [({}, upcycled.reset_index(drop=True))]
    return [({c: key.get(c) for c in GROUP_COLUMNS}, part) for key, part in group_keys(upcycled, by)]
