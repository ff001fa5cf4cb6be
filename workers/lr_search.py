"""lr_search segments: an Optuna study of short WSD runs that fixes the peak LR of one (family, size).

Each trial is a complete from-scratch WSD run of `lr_search.tokens` tokens (the segment's schedule, decaying over its
last `decay_fraction`) at a peak LR drawn log-uniformly in [low, high] by a TPE sampler seeded with the segment's
seed; its objective is the final validation loss (a diverged trial scores +inf). The result is written to
`<checkpoint_dir>/lr_search.json`; that folder is the checkpoint the planner's trunks get as their lr_search parent,
and `best_lr` reads it back (trunks whose `optim.lr` is None take their peak LR from it).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from sweeps.segments import SegmentResult, SegmentRuntime, SegmentSpec
from workers.errors import WorkerError

RESULT_FILE = "lr_search.json"


def is_lr_search_dir(path: Path) -> bool:
    return (path / RESULT_FILE).is_file()


def best_lr(path: Path) -> float:
    """The peak LR an lr_search segment chose (its checkpoint folder)."""
    return float(json.loads((path / RESULT_FILE).read_text())["best_lr"])


def trial_spec(spec: SegmentSpec, lr: float) -> SegmentSpec:
    """One trial: a from-scratch WSD run to `lr_search.tokens`, decaying over the schedule's decay fraction."""
    assert spec.lr_search is not None and spec.optim is not None and spec.schedule is not None
    tps, end = spec.tokens_per_step, spec.lr_search.tokens
    decay_steps = max(1, round(spec.schedule.decay_fraction * end / tps))
    return SegmentSpec(kind="scratch_decay" if spec.model.is_moe else "dense_decay", model=spec.model,
                       data=spec.data, optim=spec.optim.model_copy(update={"lr": lr}), schedule=spec.schedule,
                       seed=spec.seed, end_tokens=end, decay_start_tokens=end - decay_steps * tps)


def run_lr_search(spec: SegmentSpec, runtime: SegmentRuntime,
                  train: Callable[[SegmentSpec, SegmentRuntime], SegmentResult]) -> SegmentResult:
    """Run the study; `train` runs one trial segment (run_segment, passed in to keep the import one-way)."""
    import optuna

    from workers.segment import NaNLossError

    t0 = time.perf_counter()
    search = spec.lr_search
    assert search is not None
    if search.low > search.high:
        raise WorkerError(f"lr_search.low={search.low} exceeds lr_search.high={search.high}")
    if search.tokens % spec.tokens_per_step:
        raise WorkerError(f"lr_search.tokens={search.tokens} is not a multiple of batch_size·context="
                          f"{spec.tokens_per_step}")
    root = Path(runtime.checkpoint_dir)
    trials: list[dict] = []
    tokens = 0

    def objective(trial: optuna.Trial) -> float:
        nonlocal tokens
        lr = trial.suggest_float("lr", search.low, search.high, log=True)
        folder = root / f"trial_{trial.number}"
        try:
            res = train(trial_spec(spec, lr), runtime.model_copy(update={
                "checkpoint_dir": str(folder), "mlflow_tracking_uri": None, "checkpoint_every_tokens": None}))
            loss = res.val_loss if res.val_loss is not None and math.isfinite(res.val_loss) else math.inf
        except NaNLossError:
            loss = math.inf
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # only the choice is kept, not the trials' weights
        tokens += search.tokens
        trials.append({"lr": lr, "val_loss": loss})
        return loss

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=spec.seed))
    study.optimize(objective, n_trials=search.trials)
    if not math.isfinite(study.best_value):
        raise WorkerError(f"lr_search {spec.id}: every trial diverged in [{search.low}, {search.high}]; "
                          f"lower the range")
    root.mkdir(parents=True, exist_ok=True)
    body = {"segment_id": spec.id, "best_lr": study.best_params["lr"], "best_val_loss": study.best_value,
            "trials": trials}
    tmp = root / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(body, indent=2))
    tmp.replace(root / RESULT_FILE)
    wall = time.perf_counter() - t0
    return SegmentResult(segment_id=spec.id, kind=spec.kind, val_loss=study.best_value, tokens=tokens, wall_s=wall,
                         tokens_per_s=tokens / wall, checkpoint=str(root), best_lr=study.best_params["lr"],
                         metrics={"trials": float(len(trials))})
