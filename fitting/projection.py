"""Where two law forms cross along the D* path, for many parameter rows at once, and only where both still hold.

The path is Eq. 13's: from scratch at (N1, D) against upcycled at (D1 = D, D2 = D, N1). A row's D* is the first
crossing where upcycling stops winning (``dstar.Crossings.dstar``'s convention: 0 when from scratch wins over the
whole range searched, inf when upcycling still wins at its end). Unlike the single-law search of fitting/dstar.py,
the search of a row stops where either form has turned (fitting/forms.py ``turned``: its loss no longer falls with
tokens): past that point the form says nothing, so a D* that would lie beyond it is open above and the result
says at which budget the search stopped and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from upscale.fitting.forms import Form, path_columns, turned

GRID = 240  # log-spaced budgets along the path; crossings are interpolated between them in log space


@dataclass(frozen=True)
class PathDstar:
    """D* per parameter row along one path, and where each row's search stopped (inf: it ran to the end)."""

    dstar: np.ndarray  # (rows,)
    stopped_at: np.ndarray  # (rows,): the budget where a form turned; inf where none did before the range's end


def tokens_grid(span: tuple[float, float], n: int = GRID) -> np.ndarray:
    return np.geomspace(span[0], span[1], n)


def first_dstar(gap: np.ndarray, valid: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Per column of ``gap`` (log L_scratch − log L_upcycled, positive where upcycling leads), the first budget
    where a lead turns into a deficit, interpolated in log tokens; only ``valid`` points count (a row is cut at its
    first invalid point). 0: no lead anywhere; inf: the lead lasts to the end of the valid points; NaN: no valid
    point at all (the forms have turned before the range starts)."""
    points, rows = gap.shape
    cut = np.where(valid.all(axis=0), points, np.argmin(valid, axis=0))  # first invalid point, or the end
    x = np.log(tokens)
    out = np.full(rows, np.inf)
    for r in range(rows):
        g = gap[: cut[r], r]
        if not g.size:
            out[r] = np.nan
            continue
        if not (g > 0).any():
            out[r] = 0.0
            continue
        lead = int(np.argmax(g > 0))
        behind = np.flatnonzero(g[lead:] <= 0)
        if behind.size:
            j = lead + int(behind[0])
            t = g[j - 1] / (g[j - 1] - g[j])  # g[j-1] > 0 >= g[j]
            out[r] = float(np.exp(x[j - 1] + t * (x[j] - x[j - 1])))
    return out


@dataclass(frozen=True)
class FormPath:
    """One form's log loss along the path and where it has turned, (point, row): computed once per form and size,
    shared by every pair the form is in."""

    log_loss: np.ndarray
    turned: np.ndarray


def form_path(f: Form, rows: np.ndarray, n1: float, tokens: np.ndarray) -> FormPath:
    return FormPath(f.log_losses(rows, path_columns(f.arm, n1, tokens)), turned(f, rows, n1, tokens))


def pair_dstar(scratch: FormPath, upcycled: FormPath, tokens: np.ndarray) -> PathDstar:
    """D* of every row pair (row i of each side) along ``tokens``, each search stopped where a form turns."""
    ls, lu = scratch.log_loss, upcycled.log_loss
    valid = ~(scratch.turned | upcycled.turned) & np.isfinite(ls) & np.isfinite(lu)
    stopped = np.where(valid.all(axis=0), np.inf, tokens[np.argmin(valid, axis=0)])
    return PathDstar(first_dstar(ls - lu, valid, tokens), stopped)
