"""`upscale segments`: a sweep's segments as the specs `upscale train-segment` takes, and the grid axes that tell one
segment from another (also shown by `upscale status`); `upscale segments invalidate KEY` retrains a segment whose
checkpoint is corrupt or lost, and everything trained from it.

A segment's stored config is its `SegmentSpec` as JSON, the very object its id hashes, so an exported file trains
the same job: `upscale train-segment <segment_id>.json --parent PARENT_ID=DIR` for any segment with parents.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.table import Table
from typer.core import TyperGroup

from upscale.api.cli.app import console, err_console
from upscale.api.cli.local import ApiOpt, TokenOpt, connect, local_services

# The grid axes a segment may have, in the order a reader follows the DAG; the planner sets the ones that do not
# apply to a kind to None (a dense trunk has no D1, a scratch decay no method), so the non-None ones are its axes;
# parent_experts only an expansion's segments have.
AXES = ("N1", "D1", "parent_experts", "n_expert", "topk", "method", "r", "D2", "D")


def axes_text(axes: dict[str, Any]) -> str:
    """`N1=3.29e+04 D1=512 n_expert=4 topk=1 method=naive D2=256`: the segment's grid coordinates, those set only."""
    def value(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) or (isinstance(v, int) and v >= 1e5) else str(v)

    return " ".join(f"{k}={value(axes[k])}" for k in AXES if axes.get(k) is not None)


class _ListByDefault(TyperGroup):
    """`upscale segments SWEEP ...` is `upscale segments list SWEEP ...`: the listing keeps its short form beside
    the subcommands."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["list", *args]
        return super().parse_args(ctx, args)


segments_app = typer.Typer(cls=_ListByDefault, no_args_is_help=True,
                           help="A sweep's segments (`upscale segments SWEEP`), or retrain one (`invalidate KEY`).")


@segments_app.command("list")
def segments_command(
    sweep: Annotated[str, typer.Argument(help="Sweep id (`upscale sweeps` lists them).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the segment specs as one JSON list.")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Write one <segment_id>.json per segment to this "
                                             "folder, each what `upscale train-segment` takes.")] = None,
) -> None:
    """A sweep's segments in plan order (parents first): a table of ids, kinds, axes, status and parents; or their
    specs, the JSON `upscale train-segment` takes (--json, --out DIR)."""
    store = local_services().store
    store.sweep(sweep)  # an unknown id is an error, not an empty list
    members = store.members(sweep)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for seg, _ in members:
            (out / f"{seg.key}.json").write_text(json.dumps(seg.config, indent=2) + "\n")
        err_console.print(f"{len(members)} segment spec(s) written to {out}; train one with "
                          f"`upscale train-segment {out}/<segment_id>.json`")
    if as_json:
        print(json.dumps([seg.config for seg, _ in members]))
        return
    if out is not None:
        return
    table = Table(title=f"sweep {sweep}: {len(members)} segments")
    table.add_column("segment", no_wrap=True)  # ids are what a user copies: never broken across lines
    for name in ("kind", "axes", "status", "parents"):
        table.add_column(name)
    for seg, link in members:
        table.add_row(seg.key, seg.kind, axes_text(link.axes), seg.status, " ".join(seg.parents))
    console.print(table)


@segments_app.command("invalidate")
def invalidate_command(
    key: Annotated[str, typer.Argument(help="The segment's id (`upscale segments SWEEP` lists them).")],
    api: ApiOpt = None, token: TokenOpt = None,
) -> None:
    """Retrain KEY and every segment trained from it, for a checkpoint that is corrupt or lost: they go back to
    pending (results, observations and checkpoints dropped) and the sweeps holding them resume. With --api, an admin
    token; refused while one of them is running."""
    with connect(api, token) as c:
        done = c.invalidate_segment(key)
    console.print(f"{len(done['segments'])} segment(s) marked for retraining: {' '.join(done['segments'])}")
    if done["sweeps"]:
        console.print(f"sweep(s) {' '.join(done['sweeps'])} train them again (`upscale serve` or `upscale scheduler`; "
                      f"`upscale run SPEC` for an in-process run)")
