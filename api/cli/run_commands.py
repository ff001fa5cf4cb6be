"""`upscale run|gc`: run a sweep to completion in-process on Ray, and delete checkpoints the store no longer needs.

`run` takes the road every in-process run takes (control/runs.py `run_spec`): it plans the spec once, records it
(segments already trained by any earlier sweep are reused, not retrained) and drives the scheduler with a live
progress bar; re-running the same spec after an interruption resumes it. It opens the store as the service does
(`Services`, api/cli/local.py `local_services`), so the prediction ledger's hooks record the analysis's predictions
for the segments it trains. The observation table it fills is what `upscale fit --data`
reads (`upscale observations`, api/cli/sweep_commands.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from upscale.api.cli.app import console
from upscale.api.cli.local import local_services
from upscale.api.cli.progress import BarWatch
from upscale.orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from upscale.control.runs import SweepOutcome
    from upscale.control.services import Services
    from upscale.orchestrator.service import Orchestrator
    from upscale.sweeps.spec import SweepSpec


def run_sweep(sweep_spec: SweepSpec, source: str, transient: bool = False, max_concurrent: int | None = None,
              max_attempts: int = 3, new: bool = False, reuse_stale: bool = False) -> tuple[Services, SweepOutcome]:
    """Train ``sweep_spec`` to completion on the road (control/runs.py `run_spec`) with a live progress bar on
    stderr; an unfinished sweep is an error that says how to resume it (``source`` is the spec file named in that
    message). Shared by `run` and `demo`."""
    from upscale.control.runs import run_spec

    services = local_services()
    out = run_spec(services, sweep_spec, BarWatch(transient), new=new, reuse_stale=reuse_stale,
                   max_concurrent=max_concurrent, max_attempts=max_attempts).outcome
    if out.status != "done":
        sweep = services.store.sweep(out.sweep_id)
        raise OrchestratorError(f"sweep {out.sweep_id} {out.status}: {sweep.error or 'stopped'}; "
                                f"`upscale run {source}` again resumes it")
    return services, out


def run_command(
    spec: Annotated[Path, typer.Argument(help="Sweep spec, YAML or JSON.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print {sweep_id, observations, trained, reused, stale} as "
                                          "JSON.")] = False,
    max_concurrent: Annotated[int | None, typer.Option(min=1, help="Segments at once; default: as many as the "
                                                       "cluster's CPUs/GPUs hold.")] = None,
    max_attempts: Annotated[int, typer.Option(min=1, help="Failures allowed per segment before the sweep fails.")]
    = 3,
    new: Annotated[bool, typer.Option("--new", help="Record a new sweep even if one of this identical spec exists "
                                      "(default: that one is resumed, or returned if done).")] = False,
    reuse_stale: Annotated[bool, typer.Option("--reuse-stale", help="Reuse segments the store holds trained under "
                                              "an older training-semantics version instead of retraining them "
                                              "(recorded on the sweep).")] = False,
) -> None:
    """Run a sweep to completion on Ray (embedded unless RAY_ADDRESS is set) and print its observations and what
    this run trained. Running an identical spec again resumes its sweep, or returns it if done."""
    from upscale.orchestrator.observations import JSON_FIELDS, as_row
    from upscale.orchestrator.settings import get_settings
    from upscale.sweeps.loader import load_spec

    sweep_spec = load_spec(spec, max_segments=get_settings().max_segments)  # the bound `upscale plan` applies
    services, out = run_sweep(sweep_spec, str(spec), transient=as_json, max_concurrent=max_concurrent,
                              max_attempts=max_attempts, new=new, reuse_stale=reuse_stale)
    rows = [as_row(o) for o in services.store.observations(out.sweep_id)]
    report = trained_report(services.orch, out)
    if as_json:
        print(json.dumps({"sweep_id": out.sweep_id, "observations": [{k: r[k] for k in JSON_FIELDS} for r in rows],
                          **report}, indent=2))
        return
    t = report["trained"]
    table = Table(*JSON_FIELDS, title=f"sweep {out.sweep_id}: {t['segments']} segment(s) trained ({t['tokens']:.3g} "
                  f"tokens, {t['flops']:.3g} FLOPs), {report['reused']['segments']} reused, {out.wall_s:.0f} s")
    for r in rows:
        table.add_row(*("" if r[k] is None else f"{r[k]:.4f}" if k == "loss" else str(r[k]) for k in JSON_FIELDS))
    console.print(table)


def trained_report(orch: Orchestrator, out: SweepOutcome) -> dict:
    """What a run of the sweep trained (segments, planned tokens and FLOPs), what it reused (its segments done that
    this run did not train: done before, by another sweep meanwhile, by a dead scheduler's worker, or stale ones taken
    over), and the stale segments found when the sweep was recorded."""
    members = [seg for seg, _ in orch.store.members(out.sweep_id)]
    this_run = set(out.trained)
    trained = [seg for seg in members if seg.key in this_run]
    sweep = orch.store.sweep(out.sweep_id)
    return {"trained": {"segments": len(trained), "tokens": sum(s.tokens for s in trained),
                        "flops": sum(s.flops for s in trained)},
            "reused": {"segments": sum(s.status == "done" for s in members) - len(trained)},
            "stale": {"segments": sorted(sweep.stale_segments or {}), "reused": sweep.reuse_stale}}


def trained_line(orch: Orchestrator, out: SweepOutcome) -> str:
    """What a run trained and reused, in words: "the rest reused" only when something was."""
    report = trained_report(orch, out)
    trained, reused = report["trained"]["segments"], report["reused"]["segments"]
    return (f"sweep {out.sweep_id}: {trained} segment(s) trained this run"
            + (f", {reused} reused (already in the store)" if reused else "") + f", {out.wall_s:.0f} s wall")


def gc_command(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would be deleted.")] = False,
    everything: Annotated[bool, typer.Option("--all", help="Also delete checkpoints new grid points would likely "
                                             "branch from (trunks, decayed dense models).")] = False,
) -> None:
    """Delete checkpoints no pending segment needs; keep likely branch points unless --all."""
    from upscale.orchestrator.gc import collect_garbage

    rep = collect_garbage(local_services().store, everything=everything, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    console.print(f"{verb} {len(rep.deleted)} checkpoint(s), {rep.freed_bytes / 1e6:.1f} MB; kept {len(rep.kept)}")
