"""Observation tables: reading a CSV, checking it against a law, and hashing what a fit saw.

Every check raises FitError with one line that names the law, the column or the rows at fault, so the CLI can print
it as is. Row numbers are 1-based data rows (the first row after the header is row 1), as a spreadsheet shows them
less its header line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

from upscale.fitting.errors import FitError
from upscale.fitting.laws import LOSS, WEIGHT, Law


def read_table(path: str | Path) -> pd.DataFrame:
    """A CSV of observations; lines starting with '#' are comments (the bundled SYNTHETIC data carry one)."""
    p = Path(path)
    if not p.is_file():
        raise FitError(f"data file {str(p)!r} does not exist")
    try:
        return pd.read_csv(p, comment="#")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise FitError(f"cannot read {str(p)!r} as CSV: {str(e).splitlines()[0]}") from None


def _rows(mask: np.ndarray, limit: int = 10) -> str:
    idx = (np.flatnonzero(mask) + 1).tolist()
    shown = ", ".join(map(str, idx[:limit]))
    return shown + (f" and {len(idx) - limit} more" if len(idx) > limit else "")


def validate(law: Law, df: pd.DataFrame, n_free: int) -> pd.DataFrame:
    """The rows and columns ``law`` needs, as float64, after checking columns, values and the number of points; with
    the ``weight`` column too when the table has one (each row's weight in the fit, positive)."""
    needed = (*law.columns, LOSS)
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise FitError(f"law {law.name!r} needs column(s) {', '.join(missing)}; "
                       f"the table has {', '.join(map(str, df.columns))}")
    out = pd.DataFrame(index=range(len(df)))
    for c in needed:
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
        bad_nan = ~np.isfinite(v)
        if bad_nan.any():
            raise FitError(f"column {c!r} has NaN, infinite or non-numeric values in row(s) {_rows(bad_nan)}")
        allow_zero = law.exact and c == "D2"
        bad = v < 0 if allow_zero else v <= 0
        if bad.any():
            what = "negative" if allow_zero else "zero or negative"
            raise FitError(f"column {c!r} has {what} values in row(s) {_rows(bad)}; "
                           f"losses and token/parameter counts must be positive")
        out[c] = v
    if WEIGHT in df.columns:
        w = pd.to_numeric(df[WEIGHT], errors="coerce").to_numpy(dtype=float)
        bad = ~(np.isfinite(w) & (w > 0))
        if bad.any():
            raise FitError(f"column {WEIGHT!r} must be a positive number in every row; row(s) {_rows(bad)} are not "
                           f"(leave a row out of the table rather than give it weight 0)")
        out[WEIGHT] = w
    if len(out) <= n_free:
        raise FitError(f"law {law.name!r} has {n_free} free parameter(s) but the table has {len(out)} point(s); "
                       f"need at least {n_free + 1}")
    for c in law.columns:
        if out[c].nunique() < 2:
            raise FitError(f"column {c!r} has a single value ({out[c].iloc[0]:g}); law {law.name!r} needs at least "
                           f"2 distinct values of it to fit its exponent")
    return out


def data_hash(df: pd.DataFrame, columns: tuple[str, ...]) -> str:
    """sha256 of the float64 values of ``columns`` in row order: identifies the data a fit saw."""
    h = hashlib.sha256()
    for c in columns:
        h.update(c.encode())
        h.update(np.ascontiguousarray(df[c].to_numpy(dtype=float)).tobytes())
    return h.hexdigest()[:16]
