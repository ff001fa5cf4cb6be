"""LR-search segments: an Optuna study of short runs that fixes the peak LR of one (family, size) (docs/architecture.md,
"Segments and WSD reuse").

Each trial trains the segment's model from scratch for `lr_search.tokens` tokens at a log-uniform peak LR, as
`CHUNKS` consecutive trunk segments run by the ordinary segment function, so the validation loss after each chunk is
reported to Optuna and a median pruner stops a bad LR early; a diverging LR (NaN loss) counts as pruned. The study
lives in the state database, in Optuna's own tables beside ours, named after the segment's id: a retried or resumed
search continues the same study (trials its dead attempt left running are marked failed and redone). TPE is seeded
with the segment's seed. Children whose `optim.lr` is None train at the study's best LR (`resolve_lr`).
"""

from __future__ import annotations

import time

from upscale.orchestrator.errors import OrchestratorError
from upscale.orchestrator.records import SegmentRecord
from upscale.orchestrator.task import SegmentFn
from upscale.storage import SegmentFolder, join
from upscale.sweeps.segments import SegmentResult, SegmentRuntime, SegmentSpec
from upscale.workers.errors import WorkerError

CHUNKS = 4  # validation points per trial, i.e. pruning opportunities


def run_lr_search(spec: SegmentSpec, runtime: SegmentRuntime, storage: str, train: SegmentFn) -> SegmentResult:
    """Run (or continue) the study of ``spec`` to `lr_search.trials` finished trials; returns the best LR."""
    import optuna
    from optuna.trial import TrialState

    t0 = time.perf_counter()
    search, step = spec.lr_search, spec.tokens_per_step
    assert search is not None and spec.optim is not None  # guaranteed by SegmentSpec for lr_search
    kind = "scratch_trunk" if spec.model.is_moe else "dense_trunk"
    ends = sorted({max(step, round(search.tokens * (k + 1) / CHUNKS / step) * step) for k in range(CHUNKS)})
    engine = {"connect_args": {"timeout": 60}} if storage.startswith("sqlite") else {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=optuna.storages.RDBStorage(storage, engine_kwargs=engine), study_name=f"upscale-lr-{spec.id}",
        direction="minimize", load_if_exists=True, sampler=optuna.samplers.TPESampler(seed=spec.seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1))
    for stale in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(stale.number, state=TrialState.FAIL)  # left by an attempt that died
    trained = 0

    def objective(trial: optuna.Trial) -> float:
        nonlocal trained
        lr = trial.suggest_float("lr", search.low, search.high, log=True)
        root = join(runtime.checkpoint_dir, f"trial-{trial.number}")  # a path or a URI
        parent: tuple[str, str] | None = None
        start, loss = 0, float("inf")
        try:
            for k, end in enumerate(ends):
                chunk = SegmentSpec(kind=kind, model=spec.model, data=spec.data, seed=spec.seed,
                                    optim=spec.optim.model_copy(update={"lr": lr}), schedule=spec.schedule,
                                    start_tokens=start, end_tokens=end, parent_ids=(parent[0],) if parent else ())
                rt = runtime.model_copy(update={
                    "checkpoint_dir": join(root, f"chunk-{k}"), "parent_checkpoints": dict([parent]) if parent else {},
                    "mlflow_tracking_uri": None, "mlflow_run_id": None, "checkpoint_every_tokens": None,
                    "eval_every_tokens": None})  # a trial needs only each chunk's end loss
                result = train(chunk, rt)
                trained += end - start
                loss = result.val_loss if result.val_loss is not None else float("inf")
                trial.report(loss, k)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"val loss {loss:.4f} after {end} tokens")
                parent, start = (chunk.id, result.checkpoint), end
        except WorkerError as e:
            from upscale.workers.segment import NaNLossError  # torch is loaded already: training raised it

            if isinstance(e, NaNLossError):
                raise optuna.TrialPruned(str(e)) from None
            raise
        finally:
            SegmentFolder.open(root, runtime.data_cache_dir).discard()  # trial weights are never reused
        return loss

    finished = (TrialState.COMPLETE, TrialState.PRUNED)
    remaining = search.trials - len(study.get_trials(deepcopy=False, states=finished))
    if remaining > 0:
        study.optimize(objective, n_trials=remaining)
    best = study.best_trial
    states = [t.state for t in study.get_trials(deepcopy=False, states=finished)]
    wall = time.perf_counter() - t0
    return SegmentResult(segment_id=spec.id, kind=spec.kind, val_loss=None, tokens=trained, wall_s=wall,
                         tokens_per_s=trained / wall if wall else 0.0, checkpoint=None, best_lr=best.params["lr"],
                         metrics={"best_val_loss": best.value, "trials": len(states),
                                  "pruned": states.count(TrialState.PRUNED)})


def resolve_lr(spec: SegmentSpec, segs: dict[str, SegmentRecord]) -> SegmentSpec:
    """``spec`` with `optim.lr` set from its nearest lr_search ancestor when it is None (the spec's id, and so its
    row in the store, stays that of the unresolved spec)."""
    if spec.kind == "lr_search" or spec.optim is None or spec.optim.lr is not None:
        return spec
    todo = list(spec.parent_ids)
    while todo:
        parent = segs[todo.pop(0)]
        if parent.kind == "lr_search":
            best = (parent.result or {}).get("best_lr")
            if best is None:
                break
            return spec.model_copy(update={"optim": spec.optim.model_copy(update={"lr": best})})
        todo += parent.parents
    raise OrchestratorError(f"{spec.kind} segment {spec.id} has no peak LR and no finished lr_search ancestor")
