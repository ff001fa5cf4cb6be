"""`upscale plan`: compile a sweep spec into its segment DAG and print tokens, FLOPs, the saving and a time estimate.

The wall-time estimate is a planning aid, not a promise: by default a CPU sweep uses the throughput measured on a
2-core CPU (`sweeps.planner.cpu_flops_per_s`: ~50% of a 200 GFLOP/s peak at d_model >= 128, ~33% below, MoE at half
that per active FLOP; docs/architecture.md, "Measured facts") and a GPU sweep the paper's assumed 400 TFLOP/s per
GPU (Appendix A.10) times the GPUs of a segment (`sweeps.planner.gpu_flops_per_s`); `--tokens-per-s` or
`--flops-per-s` replace them with your own measured throughput. It prints the serial time (one segment at a time)
and the critical path (every ready segment at once), and GPU-hours at 400 TFLOP/s, of what would train.

The summary is control/plans.py's, the one `upscale submit` and POST /sweeps return. It compares the plan with the
local state store (UPSCALE_HOME's, or UPSCALE_DB_URL; none is created): how many segments, tokens and FLOPs are not
yet done there (`new_*`: what `upscale run` would train), and which segments the store holds only trained under an
older training-semantics version (stale: retrained, unless `--reuse-stale`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from upscale.api.cli.app import console
from upscale.control.plans import stale_lines
from upscale.orchestrator.errors import OrchestratorError
from upscale.sweeps.data_sources import check_present
from upscale.sweeps.loader import load_spec
from upscale.sweeps.memory import check_memory
from upscale.sweeps.planner import Plan, plan
from upscale.sweeps.segments import BUILTIN_CORPORA

if TYPE_CHECKING:
    from upscale.orchestrator.plan_in_store import PlanInStore


def segment_list(p: Plan) -> list[dict]:
    """Every segment of the plan, for `upscale plan --json`."""
    return [{"id": s.id, "kind": s.spec.kind, "parents": list(s.spec.parent_ids), "tokens": s.tokens, "flops": s.flops,
             "trunk": s.trunk, "axes": s.axes, "observation": s.observation.__dict__ if s.observation else None}
            for s in p.segments]


def in_store(p: Plan, reuse_stale: bool) -> PlanInStore:
    """``p`` compared with the local state store; with no store yet, nothing is done (planning creates none), and a
    base-only install (no SQLAlchemy) plans with no store and is told what to install to read one."""
    from upscale.orchestrator.plan_in_store import PlanInStore, compare
    from upscale.orchestrator.settings import get_settings

    url = get_settings().db_url
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return PlanInStore(p, reuse_stale=reuse_stale)
    try:
        from upscale.orchestrator.store import Store
    except ModuleNotFoundError as e:  # a package of the worker extra (any other import error is a bug: raised)
        raise OrchestratorError(f"the state store at {url} is read with the worker extra, which this install lacks "
                                f"({e}): pip install 'upscale[worker]' to see what of the plan is done, or plan with "
                                f"an UPSCALE_HOME that holds no store") from None
    store = Store(url)
    try:
        return compare(store, p, reuse_stale)
    finally:
        store.engine.dispose()


def duration(s: float) -> str:
    """Seconds in the largest unit that fits: `upscale plan`'s estimates, `upscale status`'s timing."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.1f} {unit}"
    return f"{s:.0f} s"


def plan_command(
    spec: Annotated[Path, typer.Argument(help="Sweep spec, YAML or JSON.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON (every segment included).")] = False,
    tokens_per_s: Annotated[float | None, typer.Option(help="Measured training throughput for the estimate.")] = None,
    flops_per_s: Annotated[float | None, typer.Option(help="Sustained FLOP/s for the estimate (instead).")] = None,
    reuse_stale: Annotated[bool, typer.Option("--reuse-stale", help="Count segments the store holds trained under "
                                              "an older training-semantics version as done (as `upscale run "
                                              "--reuse-stale` would reuse them).")] = False,
) -> None:
    """Compile SPEC into the segment DAG: segments by kind, tokens, FLOPs, the saving over independent runs, what is
    not yet done in the state store (and what is stale there), an estimated wall time, and a warning for each law of
    the analysis the grid cannot identify (why, what to add); `upscale submit` and POST /sweeps show the same."""
    from upscale.control.plans import plan_summary  # numpy and pandas: not for --help
    from upscale.orchestrator.settings import get_settings

    settings = get_settings()
    sweep = load_spec(spec, max_segments=settings.max_segments)  # the bound POST /sweeps applies
    if sweep.data.corpus not in BUILTIN_CORPORA:  # as POST /sweeps refuses it; outside the roots it may be a cluster's
        check_present("data.corpus", sweep.data.corpus, settings.data_root_paths)
    p = plan(sweep)
    summary = plan_summary(in_store(p, reuse_stale), sweep, tokens_per_s, flops_per_s)
    if as_json:
        print(json.dumps(summary.model_dump(mode="json") | {"segment_list": segment_list(p)}))
    else:
        print_plan(summary.model_dump(mode="json"))
    check_memory(sweep)  # a GPU sweep whose model does not fit one GPU: refused, naming the knobs


def print_plan(summary: dict) -> None:
    """A plan summary (control/schemas.py `PlanSummary`, as JSON) as `upscale plan` and `upscale submit` print it."""
    table = Table(title=f"plan {summary['name']}: {summary['segments']} segments")
    for col in ("kind", "count", "tokens", "FLOPs", "est. time"):
        table.add_column(col, justify="left" if col == "kind" else "right")
    for kind, k in summary["by_kind"].items():
        table.add_row(kind, str(k["count"]), f"{k['tokens']:.3g}", f"{k['flops']:.3g}", duration(k["seconds"]))
    console.print(table)
    est = summary["estimate"]
    console.print(f"total {summary['total_flops']:.3g} FLOPs; as independent runs {summary['independent_flops']:.3g} "
                  f"FLOPs: saving x{summary['saving']:.2f}")
    console.print(f"not yet in the store: {summary['new_segments']} of {summary['segments']} segments, "
                  f"{summary['new_tokens']:.3g} of {summary['tokens']:.3g} tokens, {summary['new_flops']:.3g} FLOPs")
    console.print(f"estimate at {est['basis']}: {duration(est['serial_s'])} one segment at a time, "
                  f"{duration(est['critical_path_s'])} along the critical path; "
                  f"{est['gpu_hours_at_400_tflops']:.3g} GPU-hours at 400 TFLOP/s per GPU (paper, A.10)")
    print_memory(summary["memory"])
    for line in stale_lines(summary["stale_segments"], summary["reuse_stale"]):
        console.print(Text.assemble(("warning: ", "bold yellow") if summary["stale_segments"] else "", line))
    notes = summary["notes"]
    for note in notes[:5]:
        console.print(f"[dim]rounded {note}[/]")
    if len(notes) > 5:
        console.print(f"[dim]... and {len(notes) - 5} more budgets rounded to whole steps[/]")
    for c in summary["identifiability"]:
        if not c["identifiable"]:  # Text: the reasons hold brackets-free user data, but no markup is intended
            console.print(Text.assemble(("warning: ", "bold yellow"), f"{c['law']} on {c['fit']}: {c['reason']}; "
                                        f"{c['add']}"))


def print_memory(sizes: list[dict]) -> None:
    """Per size, the memory one worker needs for its largest model at the micro-batch it trains with."""
    device = sizes[0]["device_gib"] if sizes else None
    table = Table(title="memory per worker" + (f" (of {device:.3g} GiB)" if device else " (device not known: "
                                                "micro-batches are fitted when a segment starts)"))
    for col in ("size", "largest model", "seqs/step", "micro-batch", "accum.", "GiB", "of which state", "fits"):
        table.add_column(col, justify="left" if col in ("size", "largest model") else "right")
    for m in sizes:
        micro = m["micro_batch_size"]
        table.add_row(m["size"], m["model"], str(m["sequences_per_step"]), "-" if micro is None else str(micro),
                      "-" if micro is None else str(m["accumulation_steps"]), f"{m['memory_gib']:.3g}",
                      f"{m['state_gib']:.3g}", "yes" if m["fits"] else "[bold red]no[/]")
    console.print(table)
