"""`upscale suggest SWEEP_ID --budget-flops F`: which grid extensions shrink the D* interval most per FLOP.

One code path through `connect` (api/cli/local.py): in-process it reads this machine's store (control/suggest.py);
with `--api` the server answers (POST /sweeps/{id}/suggest). `--apply` submits the suggested extensions as a sweep,
as `POST /sweeps/{id}/extend` does.
"""

from __future__ import annotations

from typing import Annotated

import typer

from upscale.api.cli.app import CommandError, console
from upscale.api.cli.fit_commands import JsonOpt, fmt, print_json
from upscale.api.cli.local import ApiOpt, TokenOpt, connect


def suggest_command(
    sweep: Annotated[str, typer.Argument(help="Sweep id (`upscale status` lists them).")],
    budget_flops: Annotated[float, typer.Option("--budget-flops",
                                                help="Training FLOPs the extensions may cost in all (marginal: what "
                                                     "the store holds is free).")],
    n1: Annotated[float | None, typer.Option("--n1",
                                             help="Dense size N1 whose D* to pin down; default: the analysis's "
                                                  "largest.")] = None,
    tolerance: Annotated[float | None, typer.Option("--tolerance",
                                                    help="Stop once the expected 95% D* interval's hi/lo ratio is at "
                                                         "most this (4: within a factor of 2 either way).")] = None,
    apply: Annotated[bool, typer.Option("--apply", help="Submit the suggested extensions as a sweep.")] = False,
    study: Annotated[str | None, typer.Option("--study", help="Narrow this expansion study's D*_expand instead (its "
                                              "label in the analysis, e.g. 'expand 4x1 -> 8x1 uniform').")] = None,
    as_json: JsonOpt = False,
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Grid extensions (new D1, D2 or from-scratch budgets, a larger dense size) ranked by the expected shrinkage of
    the D* interval at N1 per FLOP, chosen within --budget-flops from the sweep's newest analysis (`upscale analyze`
    makes one); --apply submits them."""
    for name, value, low in (("--budget-flops", budget_flops, 0.0), ("--n1", n1, 0.0), ("--tolerance", tolerance, 1.0)):
        if value is not None and not value > low:
            raise CommandError(f"{name} must be greater than {low:g}, got {value:g}")
    with connect(api, token) as c:
        out = c.suggest(sweep, budget_flops, n1=n1, tolerance=tolerance, apply=apply, study=study)
    if as_json:
        print_json(out)
        return
    from rich.table import Table

    lo, hi = out["delta_interval"]
    boot = f"; bootstrap {fmt(out['interval'][0])} – {fmt(out['interval'][1])}" if out["interval"] else ""
    ends = out["profile_interval"]
    profile = ("no crossing consistent with the data" if ends is None else
               f"{fmt(ends[0]) if ends[0] is not None else '0'} – {fmt(ends[1]) if ends[1] is not None else 'inf'}")
    name = "D*_expand" if study else "D*"
    console.print(f"{name} at N1 = {fmt(out['n1'])} ({out['group']}, analysis {out['analysis_id']}): "
                  f"{fmt(out['dstar'])} tokens, 95% interval {fmt(lo)} – {fmt(hi)} (delta method{boot}; "
                  f"profile likelihood {profile})")
    table = Table("#", "action", "marginal FLOPs", "new obs.", "expected interval after")
    for a in out["actions"]:
        table.add_row(str(a["rank"]), a["description"], fmt(a["marginal_flops"]), str(a["new_observations"]),
                      f"{fmt(a['expected_interval'][0])} – {fmt(a['expected_interval'][1])}")
    console.print(table)
    why = {"tolerance": "the interval reaches the tolerance", "budget": "nothing else fits the budget",
           "no_gain": "no other candidate shrinks the interval",
           "limit": "the most actions one call chooses; apply them (--apply) and ask again for more"}[out["stopped"]]
    console.print(f"{fmt(out['total_flops'])} of {fmt(out['budget_flops'])} FLOPs; stopped: {why}")
    if nxt := out.get("forms_disagree"):
        console.print(f"where the law forms disagree most: {nxt['runs']} (~{fmt(nxt['flops'])} FLOPs)")
    for a in out.get("stop", []):
        console.print(f"stop trunk {a['trunk']}: its {a['pending_observations']} remaining decay(s) would shrink the "
                      f"{name} interval by {a['sd_shrink']:.1%}; stopping it saves {fmt(a['remaining_flops'])} FLOPs")
    if out["applied"]:
        console.print(f"applied: sweep {out['applied']['id']} ({out['applied']['plan']['new_segments']} new segments)")
