"""`upscale train-segment`: one training segment alone, without orchestrator or Ray.

Reads a `SegmentSpec` JSON file (what the planner emits for one segment), runs `workers.segment.run_segment` with a
runtime built from the flags, shows a progress bar on stderr, and prints the result (with `--json`, one JSON object
on stdout: val_loss, tokens, wall_s, tokens_per_s, checkpoint). torch and DeepSpeed are imported inside the command.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from upscale.api.cli.app import console, err_console
from upscale.workers.errors import WorkerError

if TYPE_CHECKING:
    from upscale.sweeps.segments import SegmentResult


def _parents(values: list[str], parent_ids: tuple[str, ...]) -> dict[str, str]:
    """`ID=DIR` pairs; a bare `DIR` is accepted when the segment has exactly one parent."""
    out = {}
    for v in values:
        if "=" in v:
            k, d = v.split("=", 1)
        elif len(parent_ids) == 1:
            k, d = parent_ids[0], v
        else:
            raise WorkerError(f"--parent {v!r}: write PARENT_ID=DIR (this segment has parents {list(parent_ids)})")
        out[k] = d
    return out


def train_segment(
    segment: Annotated[Path, typer.Argument(help="A SegmentSpec JSON file.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as one JSON object.")] = False,
    checkpoint_dir: Annotated[
        str | None, typer.Option(help="Where checkpoints go, a path or an fsspec URI (s3://...); default "
                                      "UPSCALE_CHECKPOINT_DIR/<segment id>.")
    ] = None,
    parent: Annotated[
        list[str] | None, typer.Option(help="Parent checkpoint as PARENT_ID=DIR (or DIR for a single parent); DIR "
                                            "may be a URI.")
    ] = None,
    mlflow_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI; default: no MLflow logging.")] = None,
    threads: Annotated[int, typer.Option(min=1, help="torch threads.")] = 1,
    device: Annotated[str, typer.Option(help="cpu or cuda (bf16 autocast).")] = "cpu",
    eval_every_tokens: Annotated[int | None, typer.Option(help="Periodic validation cadence.")] = None,
    checkpoint_every_tokens: Annotated[int | None, typer.Option(help="Periodic resume checkpoints.")] = None,
    zero_stage: Annotated[int, typer.Option(min=0, max=2, help="DeepSpeed ZeRO stage.")] = 0,
) -> None:
    """Run one segment alone (any kind but lr_search, which the orchestrator runs); resumes if interrupted."""
    # DeepSpeed logs to stdout (bound when it is imported); keep stdout for the result alone
    with contextlib.redirect_stdout(sys.stderr):
        result = _run(segment, checkpoint_dir, parent or [], mlflow_uri, threads, device, eval_every_tokens,
                      checkpoint_every_tokens, zero_stage, quiet=json_out)
    out = {k: getattr(result, k) for k in ("val_loss", "tokens", "wall_s", "tokens_per_s", "checkpoint")}
    if json_out:
        typer.echo(json.dumps(out))
        return
    loss = "n/a" if result.val_loss is None else f"{result.val_loss:.4f}"
    console.print(f"{result.kind} {result.segment_id}: val_loss {loss}, {result.tokens} tokens in "
                  f"{result.wall_s:.1f} s ({result.tokens_per_s:,.0f} tokens/s); checkpoint {result.checkpoint}")


def _run(segment: Path, checkpoint_dir: str | None, parent: list[str], mlflow_uri: str | None, threads: int,
         device: str, eval_every_tokens: int | None, checkpoint_every_tokens: int | None, zero_stage: int,
         quiet: bool) -> SegmentResult:
    """Parse the spec, build the runtime, run the segment under a progress bar on stderr."""
    from pydantic import ValidationError
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from upscale import storage
    from upscale.api.cli.progress import BarWatch
    from upscale.control.runs import announce_op_build, build_token_cache
    from upscale.orchestrator.settings import get_settings
    from upscale.sweeps.segments import SegmentRuntime, SegmentSpec
    from upscale.workers.segment import StepInfo, run_segment

    if not segment.is_file():
        raise WorkerError(f"segment file {segment} does not exist")
    try:
        spec = SegmentSpec.model_validate_json(segment.read_text())
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise WorkerError(f"{segment}: {where}: {first['msg']} ({e.error_count()} error(s))") from None
    location = checkpoint_dir or storage.join(get_settings().checkpoint_dir, spec.id)
    runtime = SegmentRuntime(
        checkpoint_dir=location if storage.is_uri(location) else str(Path(location).absolute()),
        parent_checkpoints=_parents(parent, spec.parent_ids),
        mlflow_tracking_uri=mlflow_uri, num_threads=threads, device=device, eval_every_tokens=eval_every_tokens,
        checkpoint_every_tokens=checkpoint_every_tokens, zero_stage=zero_stage,
    )
    watch = BarWatch()
    if device == "cpu":
        announce_op_build(watch)
    build_token_cache(watch, spec.data, spec.model.context, None)  # where run_segment looks: no data_cache_dir given
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
               TimeRemainingColumn())
    with Progress(*columns, console=err_console, transient=quiet) as bar:
        task = bar.add_task(f"{spec.kind} {spec.id}", total=max(1, spec.end_tokens - spec.start_tokens),
                            status="starting")

        def on_step(info: StepInfo) -> None:
            bar.update(task, completed=info.tokens - info.start_tokens,
                       status=f"{info.tokens} tokens  loss {info.loss:.4f}  lr {info.lr:.2e}")

        return run_segment(spec, runtime, on_step=on_step)
