"""A plan's observation coordinates as fitting/identifiability.py reads them: what `upscale plan` checks before
anything trains, with the same group labels the analysis uses for the measured observations."""

from __future__ import annotations

from upscale.fitting.groups import group_label
from upscale.fitting.identifiability import Grid, Row
from upscale.sweeps.planner import Plan


def planned_grid(p: Plan) -> Grid:
    """The distinct observation coordinates of a plan, by kind (upcycled ones per method, r and E x k; expanded ones
    in none)."""
    dense: set[Row] = set()
    scratch: set[Row] = set()
    upcycled: dict[str, set[Row]] = {}
    for s in p.observations():
        o = s.observation
        if o.kind == "dense":
            dense.add((o.N1, o.D1))
        elif o.kind == "scratch":
            scratch.add((o.N1, o.D))
        elif o.kind == "upcycled":  # expansion studies are not checked at plan time (fitting/expansion.py at analysis)
            group = group_label({"method": o.method, "r": o.r, "n_expert": o.n_expert, "topk": o.topk})
            upcycled.setdefault(group, set()).add((o.N1, o.D1, o.D2))
    return Grid(tuple(sorted(dense)), tuple(sorted(scratch)), {g: tuple(sorted(rows)) for g, rows in upcycled.items()})
