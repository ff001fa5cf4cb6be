"""A real segment function for scheduler tests: it trains nothing, but keeps every contract of
`workers.segment.run_segment` that the orchestrator relies on, and logs what it did.

* It checks that every parent checkpoint the orchestrator passes exists.
* It steps through [start_tokens, end_tokens) one optimiser step at a time (sleeping `step_s` from
  `<checkpoint root>/knobs.json`), writes a resume checkpoint every `runtime.checkpoint_every_tokens`, and on a new
  attempt resumes from the last one, as the real worker does.
* A file `<checkpoint root>/fail-<segment id>` holding n makes the next n attempts fail half-way (after a resume
  checkpoint), which is how tests inject worker failures; holding `bad` makes it raise a WorkerError (a bad value,
  which no retry can fix) at once; holding `die` makes the worker process SIGKILL itself half-way, once.
* `<checkpoint root>/events.jsonl` gets one line per start (with the token count it resumed from) and per finish.
  A `linger_s` knob holds the worker that long after its finish line, before it returns its result: the window in
  which a worker killed would have its segment trained again.
* `<checkpoint root>/losses.json` ({segment id: loss}) overrides the loss of the segments it names: the prediction
  ledger's test draws them from a known law with known noise.
* Into the orchestrator's MLflow run it logs a `train_loss` curve, one point per step (step = tokens seen), as the
  real worker does, through the same `MetricLogger`.
Its loss is a known function of the budget, so observations can be checked exactly.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

from upscale.sweeps.segments import SegmentResult, SegmentRuntime, SegmentSpec
from upscale.workers.errors import WorkerError
from upscale.workers.tracking import MetricLogger


def loss_of(spec: SegmentSpec) -> float:
    """The deterministic 'validation loss' of a segment: falls with tokens, MoE a little lower, best at LR 10^-2.5."""
    lr_penalty = 0.1 * (math.log10(spec.optim.lr) + 2.5) ** 2 if spec.optim and spec.optim.lr else 0.0
    return 2.0 + 40.0 * spec.end_tokens ** -0.5 - 0.01 * spec.model.n_expert + lr_penalty


def log_event(root: Path, **event: object) -> None:
    with open(root / "events.jsonl", "a") as f:  # O_APPEND: whole lines from concurrent workers
        f.write(json.dumps(event) + "\n")


def counting_segment(spec: SegmentSpec, runtime: SegmentRuntime) -> SegmentResult:
    t0 = time.perf_counter()
    out = Path(runtime.checkpoint_dir)
    root = out.parent
    out.mkdir(parents=True, exist_ok=True)
    for parent, path in runtime.parent_checkpoints.items():
        if not Path(path).exists():
            raise FileNotFoundError(f"parent {parent} checkpoint {path} is missing")
    knobs = json.loads((root / "knobs.json").read_text()) if (root / "knobs.json").exists() else {}
    resume = out / "resume.json"
    tokens = json.loads(resume.read_text())["tokens"] if resume.exists() else spec.start_tokens
    log_event(root, event="start", segment=spec.id, kind=spec.kind, tokens=tokens, lr=spec.optim and spec.optim.lr)
    fail = root / f"fail-{spec.id}"
    planned = fail.read_text() if fail.exists() else "0"
    if planned == "bad":
        raise WorkerError(f"segment {spec.id}: a bad value")
    die = planned == "die"
    failures_left = 0 if die else int(planned)
    step = spec.tokens_per_step or spec.end_tokens or 1
    every = runtime.checkpoint_every_tokens
    curve = MetricLogger(runtime.mlflow_tracking_uri if runtime.mlflow_run_id else None, runtime.mlflow_run_id,
                         run_name=spec.kind)
    while tokens < spec.end_tokens:
        time.sleep(knobs.get("step_s", 0.0))
        tokens += step
        curve.log(tokens, {"train_loss": loss_of(spec) + 1.0 / tokens})
        if every and (tokens - spec.start_tokens) % every == 0:
            resume.write_text(json.dumps({"tokens": tokens}))
        if failures_left and tokens - spec.start_tokens >= (spec.end_tokens - spec.start_tokens) // 2:
            fail.write_text(str(failures_left - 1))
            curve.close()
            raise RuntimeError(f"injected failure at {tokens} tokens")
        if tokens in spec.save_at_tokens:
            _checkpoint(out / f"tokens-{tokens}", spec, tokens)
        if die and tokens - spec.start_tokens >= (spec.end_tokens - spec.start_tokens) // 2:
            fail.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
    curve.close()
    final = _checkpoint(out / "final", spec, spec.end_tokens)
    # branch points passed in an earlier (failed) attempt are on disk already
    branches = {t: str(out / f"tokens-{t}") for t in spec.save_at_tokens if (out / f"tokens-{t}").is_dir()}
    log_event(root, event="end", segment=spec.id, kind=spec.kind)
    time.sleep(knobs.get("linger_s", 0.0))
    wall = time.perf_counter() - t0
    trained = spec.end_tokens - spec.start_tokens
    has_loss = spec.kind not in ("upcycle", "lr_search")
    losses = json.loads((root / "losses.json").read_text()) if (root / "losses.json").exists() else {}
    return SegmentResult(segment_id=spec.id, kind=spec.kind,
                         val_loss=losses.get(spec.id, loss_of(spec)) if has_loss else None,
                         tokens=trained, wall_s=wall, tokens_per_s=trained / max(wall, 1e-9), checkpoint=final,
                         branch_checkpoints=branches, best_lr=1e-3 if spec.kind == "lr_search" else None)


def _checkpoint(path: Path, spec: SegmentSpec, tokens: int) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "meta.json").write_text(json.dumps({"segment": spec.id, "tokens": tokens}))
    return str(path)
