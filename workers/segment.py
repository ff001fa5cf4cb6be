"""`run_segment(spec, runtime) -> SegmentResult`: one training job of any kind (docs/architecture.md, "Segments and WSD
reuse").

The orchestrator calls this inside a Ray task; `upscale train-segment` calls it alone. The training path, top to
bottom: pick the model and the starting state (a resume checkpoint of this segment, else the parent's checkpoint,
else a fresh init), wrap it in the DeepSpeed engine, then for every step draw the batch that is a pure function of
(data_seed, step), set the LR from the pure WSD function of absolute tokens, step, log, save at branch points and
periodically, evaluate. Nothing depends on where a run started, so trunk + decay branch, a resumed run and one
uninterrupted WSD run are the same computation (bit-exact on CPU).

Starting states (`runtime.parent_checkpoints`): a folder written by `workers.checkpoints.save` (a trunk's branch
point: weights and optimiser state, resumed with `load_checkpoint`), or one holding only a `model/` export (an
upcycled MoE: fresh optimiser). Upcycle segments do not train: they load the parent's decayed dense model, call the
upcycling registry (with calibration windows from the training data) and save the MoE; expand segments likewise grow a
decayed MoE's experts m-fold (workers/upcycling/expansion.py). dense_import segments do not
train either: they check that an imported dense model's weights are still the planned ones, save it as a checkpoint
at its D1 and measure its validation loss. lr_search segments are the
orchestrator's (an Optuna study whose trials are ordinary segments run here); it resolves `optim.lr` for their
children before calling this function.

Checkpoint locations (`runtime.checkpoint_dir`, parent checkpoints, the result's) are local paths or fsspec URIs:
`upscale.storage` stages a URI on local disk for DeepSpeed, publishes each checkpoint as soon as it is saved, and
fetches parents.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from upscale import storage
from upscale.data_roots import OutsideRoots, confine
from upscale.sweeps import run_tags
from upscale.sweeps.model_dirs import SOURCE_FILE, confine_model_files, weights_fingerprint
from upscale.sweeps.segments import BUILD_KINDS, SegmentResult, SegmentRuntime, SegmentSpec
from upscale.workers import checkpoints
from upscale.workers.data import TokenData, load_tokens
from upscale.workers.engine import NonFiniteLoss, build_engine, release_device_memory, train_step
from upscale.workers.errors import WorkerError
from upscale.workers.evaluate import expert_load, reduce_expert_counts, val_loss
from upscale.workers.memory import device_memory, fitting_micro_batch
from upscale.workers.model import ModelConfig, UpscaleLM, build_model, empty_model
from upscale.workers.parallel import Ranks, current_ranks, ep_size_for, expert_parallel_rank, expert_slice
from upscale.workers.schedule import check_schedule, lr_multiplier
from upscale.workers.tracking import MetricLogger
from upscale.workers.weights import CONFIG_FILE, load_model, save_model

IMPORT_EVAL_BATCH = 8  # windows per forward pass when an imported model's validation loss is measured (a mean over
# tokens: the batching changes only the summation order)
# windows handed to data-driven methods (llama-moe sharing, router-upcycling, utility expansion)
CALIBRATION_TOKENS = 8192
SHAPE_FIELDS = ("n_layer", "d_model", "n_head", "vocab_size", "context")


class NaNLossError(WorkerError):
    """Training stopped because the loss became NaN/inf; the last good checkpoint is kept."""

    def __init__(self, step: int, tokens: int, detail: str, last_checkpoint: Path | None) -> None:
        self.step, self.tokens, self.detail, self.last_checkpoint = step, tokens, detail, last_checkpoint
        kept = f"last good checkpoint: {last_checkpoint}" if last_checkpoint else "no checkpoint was saved"
        super().__init__(f"loss became non-finite at step {step} ({tokens} tokens): {detail}; training stopped, "
                         f"{kept}; lower optim.lr or raise warmup_tokens")

    def __reduce__(self):  # rebuilt from its fields when it crosses processes (Ray, a Ray Train worker group)
        return type(self), (self.step, self.tokens, self.detail, self.last_checkpoint)


@dataclass(frozen=True)
class StepInfo:
    """What a progress hook sees after every optimiser step."""

    step: int
    tokens: int
    start_tokens: int
    end_tokens: int
    loss: float
    lr: float


StepHook = Callable[[StepInfo], None]


def run_segment(spec: SegmentSpec, runtime: SegmentRuntime, on_step: StepHook | None = None) -> SegmentResult:
    """Run one segment to completion (resuming from its own last checkpoint if one exists).

    With `runtime.workers > 1` every process of the group calls this (workers/parallel.py); rank 0 writes the
    files and the metrics, and every rank returns the same result."""
    t0 = time.perf_counter()
    torch.set_num_threads(runtime.num_threads)
    ranks = current_ranks(runtime.workers)
    if spec.kind == "lr_search":
        raise WorkerError("lr_search segments are run by the orchestrator (orchestrator/lr_search.py: an Optuna "
                          "study whose trials call run_segment); give optim.lr to train a segment alone")
    try:
        if spec.kind in BUILD_KINDS | {"dense_import"}:
            if ranks.world > 1:
                raise WorkerError(f"a {spec.kind} segment does not train: run it with workers=1")
            run = {"upcycle": _upcycle, "expand": _expand, "dense_import": _import_dense}[spec.kind]
            return run(spec, runtime, t0)
        return _train(spec, runtime, on_step, t0, ranks)
    finally:  # the engine and model went with the returning frame (a failed one's are the traceback's until it goes)
        release_device_memory(runtime.device)


def _meta(spec: SegmentSpec) -> dict:
    return {"segment_id": spec.id, "kind": spec.kind, "parent_ids": list(spec.parent_ids)}


def _start_checkpoint(spec: SegmentSpec, runtime: SegmentRuntime) -> Path | None:
    """The parent checkpoint a segment starts from; None = a fresh init.

    Trunks from init (start_tokens 0) have only lr_search parents, whose LR the orchestrator has already put into
    `optim.lr`, so their parents are not read. Anything starting past 0 tokens (a decay branch, a trunk continued
    in chunks), MoE trunks, upcycles and expands need exactly one parent folder holding a model (a checkpoint
    sidecar, or a model folder).
    """
    needed = spec.kind in BUILD_KINDS | {"moe_trunk"} or spec.start_tokens > 0
    if not needed:
        return None
    missing = [p for p in spec.parent_ids if p not in runtime.parent_checkpoints]
    if missing or not spec.parent_ids:
        raise WorkerError(f"{spec.kind} segment {spec.id}: needs its parent's checkpoint; none given for parent(s) "
                          f"{missing or '(no parent_ids)'} in runtime.parent_checkpoints")
    locations = [runtime.parent_checkpoints[p] for p in spec.parent_ids]
    paths = [storage.fetch(loc, storage.staging_root(runtime.data_cache_dir)) for loc in locations]
    found = [p for p in paths if (p / checkpoints.META_FILE).is_file() or
             (checkpoints.model_dir(p) / CONFIG_FILE).is_file()]
    if len(found) != 1:
        absent = [loc for loc in locations if not storage.exists(loc)]
        why = f"{absent} does not exist" if absent else f"{len(found)} of {locations} hold a model"
        raise WorkerError(f"{spec.kind} segment {spec.id}: expected exactly one parent checkpoint holding a model; "
                          f"{why}")
    return found[0]


def _check_shape(cfg: ModelConfig, spec: SegmentSpec, where: Path) -> None:
    diff = [f"{k}: checkpoint {getattr(cfg, k)} vs segment {getattr(spec.model, k)}"
            for k in SHAPE_FIELDS if getattr(cfg, k) != getattr(spec.model, k)]
    if diff:
        raise WorkerError(f"checkpoint {where} is of a different model shape ({', '.join(diff)})")


def _data(spec: SegmentSpec, runtime: SegmentRuntime) -> TokenData:
    data = load_tokens(spec.data, spec.model.context, runtime.data_cache_dir, data_roots=runtime.data_roots)
    if data.vocab_size > spec.model.vocab_size:
        raise WorkerError(f"the {spec.data.tokenizer} tokeniser has {data.vocab_size} tokens but "
                          f"model.vocab_size={spec.model.vocab_size}; set model.vocab_size >= {data.vocab_size}")
    return data


def _upcycle(spec: SegmentSpec, runtime: SegmentRuntime, t0: float) -> SegmentResult:
    from upscale.workers.upcycling import upcycle

    parent = _start_checkpoint(spec, runtime)
    assert parent is not None  # upcycle always needs one
    dense_cfg, dense_sd = checkpoints.load_weights(parent)
    _check_shape(dense_cfg, spec, parent)
    if dense_cfg.is_moe:
        raise WorkerError(f"upcycle parent {parent} is already an MoE ({dense_cfg.n_expert} experts)")
    calibration = _data(spec, runtime).calibration(spec.upcycle.seed, CALIBRATION_TOKENS, spec.model.context)
    cfg, moe_sd = upcycle(dense_sd, ModelConfig.from_spec(spec.model), spec.upcycle, calibration)
    return _save_built(spec, runtime, t0, "upcycled", cfg, moe_sd)


def _expand(spec: SegmentSpec, runtime: SegmentRuntime, t0: float) -> SegmentResult:
    """The parent MoE's final weights (a scratch decay's) grown to spec.model's m·E experts, top-k kept; the
    utility strategy ranks the parent's experts on calibration windows of the training data."""
    from upscale.workers.upcycling import expand

    grow = spec.expand
    assert grow is not None  # guaranteed by SegmentSpec for expand
    parent = _start_checkpoint(spec, runtime)
    assert parent is not None  # expand always needs one
    parent_cfg, parent_sd = checkpoints.load_weights(parent)
    _check_shape(parent_cfg, spec, parent)
    if not parent_cfg.is_moe:
        raise WorkerError(f"expand parent {parent} is not an MoE checkpoint (n_expert={parent_cfg.n_expert}): "
                          "expansion grows a trained MoE's experts")
    if parent_cfg.n_expert * grow.factor != spec.model.n_expert:
        raise WorkerError(f"expand parent {parent} has {parent_cfg.n_expert} experts; x{grow.factor} is not the "
                          f"segment's n_expert={spec.model.n_expert}")
    calibration = None
    if grow.strategy == "utility":
        calibration = _data(spec, runtime).calibration(grow.seed, CALIBRATION_TOKENS, spec.model.context)
    cfg, moe_sd = expand(parent_sd, parent_cfg, grow, calibration, topk=spec.model.topk)
    return _save_built(spec, runtime, t0, "expanded", cfg, moe_sd)


def _save_built(spec: SegmentSpec, runtime: SegmentRuntime, t0: float, name: str, cfg: ModelConfig,
                weights: dict[str, torch.Tensor]) -> SegmentResult:
    """An upcycled or expanded MoE as the segment's checkpoint: a model folder the MoE trunk starts from with a
    fresh optimiser."""
    folder = storage.SegmentFolder.open(runtime.checkpoint_dir, runtime.data_cache_dir)
    out = folder.local / name
    save_model(out / checkpoints.MODEL_DIR, cfg, weights)
    checkpoints.write_meta(out, {**_meta(spec), "tokens": 0}, cfg)
    folder.push(out)
    wall = time.perf_counter() - t0
    return SegmentResult(segment_id=spec.id, kind=spec.kind, val_loss=None, tokens=0, wall_s=wall,
                         tokens_per_s=0.0, checkpoint=folder.location_of(out))


def _import_dense(spec: SegmentSpec, runtime: SegmentRuntime, t0: float) -> SegmentResult:
    """A dense model trained elsewhere, as a checkpoint at its D1 (`tokens_<D1>/model/` + sidecar) that upcycle
    segments start from, and its validation loss on the sweep's data: one dense observation. The weights must still
    be the ones the segment was planned from (their SHA-256 is its identity)."""
    source = spec.dense_import
    assert source is not None  # guaranteed by SegmentSpec for dense_import
    if runtime.data_roots is not None:  # a server's sweep: as at submit, no file linked out of its roots is read
        roots = [Path(r) for r in runtime.data_roots]
        try:
            confine_model_files(source.path, lambda f: confine(f, roots, instead=None))
        except OutsideRoots as e:
            raise WorkerError(f"model.dense.path: {e}") from None
    found = weights_fingerprint(source.path)
    if found != source.fingerprint:
        raise WorkerError(f"the weights in {source.path} changed since the sweep was planned (sha256 {found[:16]}, "
                          f"planned {source.fingerprint[:16]}); submit the sweep again to plan from them")
    cfg, weights = load_model(source.path)
    if cfg.context < spec.model.context:
        raise WorkerError(f"the model in {source.path} has context {cfg.context}, less than the sweep's "
                          f"{spec.model.context}")
    cfg = cfg.model_copy(update={"context": spec.model.context})  # the model as the sweep uses it, as its children
    _check_shape(cfg, spec, Path(source.path))
    folder = storage.SegmentFolder.open(runtime.checkpoint_dir, runtime.data_cache_dir)
    out = folder.local / checkpoints.tag_for(spec.end_tokens)
    save_model(out / checkpoints.MODEL_DIR, cfg, weights)
    if (Path(source.path) / SOURCE_FILE).is_file():  # provenance (the Hugging Face source) travels with the model
        shutil.copyfile(Path(source.path) / SOURCE_FILE, out / checkpoints.MODEL_DIR / SOURCE_FILE)
    model = empty_model(cfg, runtime.device)
    model.load_state_dict(weights)
    val_set = _data(spec, runtime).val_batches(spec.data.eval_tokens, spec.model.context, IMPORT_EVAL_BATCH)
    logger = MetricLogger(runtime.mlflow_tracking_uri, runtime.mlflow_run_id, run_name=run_tags.run_name(spec),
                          params=run_tags.segment_params(spec),
                          tags=run_tags.segment_tags(spec.id) | runtime.mlflow_tags)
    with logger:
        loss = val_loss(model, val_set, runtime.device)
        logger.log(spec.end_tokens, {"val_loss": loss})
    checkpoints.write_meta(out, {**_meta(spec), "tokens": spec.end_tokens}, cfg)
    folder.push(out)
    return SegmentResult(segment_id=spec.id, kind=spec.kind, val_loss=loss, tokens=0,
                         wall_s=time.perf_counter() - t0, tokens_per_s=0.0, checkpoint=folder.location_of(out),
                         curve=[(spec.end_tokens, loss)])


@dataclass
class _Start:
    """Where training starts: the model's config (the single-process one, what checkpoints record), the model
    this rank trains, the full weights to load into it once the engine has made the expert-parallel groups (a
    multi-process weights-only parent; None when the model holds them already or the engine state comes from
    `meta`'s checkpoint), and a branch point's sidecar."""

    cfg: ModelConfig
    model: UpscaleLM
    weights: dict[str, torch.Tensor] | None
    meta: dict | None


def _initial_model(spec: SegmentSpec, parent: Path | None, ranks: Ranks, device: str) -> _Start:
    """The model to train, allocated on `device`. Its config comes from the parent when there is one (an upcycling
    method may have reshaped the MoE), else from the spec; on several processes the MoE is built expert parallel.
    Only a fresh init draws weights (on several processes, this rank's experts only); a model whose weights come
    from the parent is allocated and left for them."""
    meta, weights = None, None
    if parent is None:
        cfg = ModelConfig.from_spec(spec.model)
    elif checkpoints.has_engine_state(parent):  # a branch point: weights and optimiser come from load_checkpoint
        meta = checkpoints.read_meta(parent)
        cfg = ModelConfig.model_validate(meta["model_config"])
    else:  # weights only (an upcycled MoE): fresh optimiser
        cfg, weights = checkpoints.load_weights(parent)
    if parent is not None:
        _check_shape(cfg, spec, parent)
    ep_size = ep_size_for(cfg, ranks.world)
    local_cfg = cfg.model_copy(update={"ep_size": ep_size})
    if parent is None:  # each rank's experts are its slice of the single-process init
        return _Start(cfg, build_model(local_cfg, spec.seed, device, _expected_ep_rank(ranks, ep_size)), None, meta)
    model = empty_model(local_cfg, device)
    if weights is not None and ep_size == 1:
        model.load_state_dict(weights)
        weights = None
    return _Start(cfg, model, weights, meta)


def _expected_ep_rank(ranks: Ranks, ep_size: int) -> int:
    """The expert-parallel rank DeepSpeed's engine will give this process (its groups are runs of ep_size
    consecutive ranks), known before the engine exists so that a fresh init draws only this rank's experts."""
    return ranks.rank % ep_size


def _train(spec: SegmentSpec, runtime: SegmentRuntime, on_step: StepHook | None, t0: float,
           ranks: Ranks) -> SegmentResult:
    optim, sched = spec.optim, spec.schedule
    assert optim is not None and sched is not None  # guaranteed by SegmentSpec for training kinds
    check_schedule(sched, spec.decay_start_tokens, spec.end_tokens)
    if optim.lr is None:
        raise WorkerError(f"segment {spec.id}: optim.lr is None; the orchestrator sets it from the lr_search parent "
                          f"before training; give optim.lr to run the segment alone")
    for name in ("checkpoint_every_tokens", "eval_every_tokens"):
        every = getattr(runtime, name)
        if every is not None and (every <= 0 or every % spec.tokens_per_step):
            raise WorkerError(f"runtime.{name}={every} must be a positive multiple of batch_size·context="
                              f"{spec.tokens_per_step}")
    parent = _start_checkpoint(spec, runtime)
    data = _data(spec, runtime)
    folder = storage.SegmentFolder.open(runtime.checkpoint_dir, runtime.data_cache_dir)
    root = folder.pull(spec.id)  # a URI: its local mirror, holding the newest checkpoint it published
    own = checkpoints.complete(root, spec.id)
    resume = max(own.items())[1] if own else None  # our own newest checkpoint beats the parent's
    start = _initial_model(spec, resume or parent, ranks, runtime.device)
    cfg = start.cfg
    if start.meta is not None and not resume and start.meta["tokens"] != spec.start_tokens:
        raise WorkerError(f"{spec.kind} segment starts at {spec.start_tokens} tokens but its parent checkpoint "
                          f"{parent} is at {start.meta['tokens']} tokens: the branch point is not one the trunk "
                          f"saved")
    start.model.activation_checkpointing = runtime.activation_checkpointing
    micro = runtime.micro_batch_size or fitting_micro_batch(
        cfg, optim.batch_size // ranks.world, ranks.world, runtime.activation_checkpointing,
        device_memory(runtime.device, runtime.num_threads))
    engine = build_engine(start.model, optim, runtime.zero_stage, runtime.device, ranks, micro)
    ep_size = start.model.cfg.ep_size
    if (ep_rank := expert_parallel_rank(ep_size)) != _expected_ep_rank(ranks, ep_size):
        raise WorkerError(f"DeepSpeed made rank {ranks.rank} expert-parallel rank {ep_rank}, not rank % ep_size = "
                          f"{_expected_ep_rank(ranks, ep_size)} as upscale's expert placement expects; install the "
                          f"DeepSpeed version pyproject.toml pins")
    if start.weights is not None:  # in place, after the engine made the expert groups: DeepSpeed's params stay
        engine.module.load_state_dict(expert_slice(start.weights, cfg, ep_size, ep_rank))
    if start.meta is not None:  # a branch point or our own resume checkpoint: weights and optimiser state
        checkpoints.load(engine, resume or parent, cfg, ep_size)

    tokens = spec.start_tokens if resume is None else start.meta["tokens"]
    keep = set(spec.save_at_tokens) | {spec.end_tokens}
    last_good: Path | None = resume
    periodic: Path | None = None if resume is None or tokens in keep else resume  # resume-only: removed when superseded

    tps, bs, ctx = spec.tokens_per_step, optim.batch_size, spec.model.context
    stream = 1 if spec.kind in ("moe_trunk", "moe_decay") else 0  # D2 tokens are new to the upcycled model
    val_set = data.val_batches(spec.data.eval_tokens, ctx, bs)
    summary: dict[str, float] = {}
    # Alone (no run id), the worker creates the run and names and describes it as the orchestrator would.
    logger = MetricLogger(runtime.mlflow_tracking_uri if ranks.main else None, runtime.mlflow_run_id,
                          run_name=run_tags.run_name(spec), params=run_tags.segment_params(spec),
                          tags=run_tags.segment_tags(spec.id) | runtime.mlflow_tags)
    # every validation of this segment, (tokens, loss); a resume continues the one its checkpoint carried
    curve: list[tuple[int, float]] = [] if resume is None else [(t, v) for t, v in start.meta.get("curve", [])]

    def validate() -> float:
        loss = val_loss(engine.module, val_set, runtime.device, ranks)
        logger.log(tokens, {"val_loss": loss})
        curve.append((tokens, loss))
        return loss

    with logger:
        if resume is None:
            summary["val_loss_start"] = validate()
        train_s, trained = 0.0, 0
        while tokens < spec.end_tokens:
            ts = time.perf_counter()  # tokens/s counts batch drawing and the step, not evaluation or checkpoints
            step = tokens // tps
            batch = data.batch(spec.data.data_seed, step, bs, ctx, stream=stream)
            lr = optim.lr * lr_multiplier(tokens + tps, sched, spec.decay_start_tokens, spec.end_tokens)
            try:
                stats = train_step(engine, batch, lr, cfg.aux_loss_weight, runtime.device, ranks)
            except NonFiniteLoss as e:
                logger.log(tokens, {"nan_step": step})
                raise NaNLossError(step, tokens, str(e), last_good) from None
            train_s += time.perf_counter() - ts
            tokens += tps
            trained += tps
            if (step + 1) % runtime.log_every_steps == 0 or tokens == spec.end_tokens:
                point = {"train_loss": stats.loss, "lr": lr, "tokens_per_s": trained / train_s}
                if stats.grad_norm is not None:
                    point["grad_norm"] = stats.grad_norm
                if cfg.is_moe:
                    reduce_expert_counts(engine.module, ranks)
                    point |= {"aux_loss": stats.aux_loss, **expert_load(engine.module)}
                logger.log(tokens, point)
                summary |= {k: v for k, v in point.items() if not k.startswith("load/")}
            if runtime.eval_every_tokens and tokens % runtime.eval_every_tokens == 0 and tokens < spec.end_tokens:
                validate()  # before a checkpoint at the same tokens, so that its curve holds this point
            every = runtime.checkpoint_every_tokens
            if tokens in keep or (every and tokens % every == 0):
                last_good = checkpoints.save(engine, root, tokens, cfg, {**_meta(spec), "phase": _phase(spec, tokens),
                                                                         "curve": curve}, ep_size, ranks)
                folder.push(last_good, ranks)  # published now: a node lost later resumes elsewhere from it
                if periodic is not None:
                    folder.remove(periodic, ranks)
                periodic = None if tokens in keep else last_good
            if on_step is not None:
                on_step(StepInfo(step, tokens, spec.start_tokens, spec.end_tokens, stats.loss, lr))
        final = validate()
    done = folder.complete(spec.id)
    final_ckpt = done[spec.end_tokens]
    branches = {t: p for t, p in done.items() if t in spec.save_at_tokens}
    return SegmentResult(
        segment_id=spec.id, kind=spec.kind, val_loss=final, tokens=spec.end_tokens - spec.start_tokens,
        wall_s=time.perf_counter() - t0, tokens_per_s=trained / train_s if train_s else 0.0,
        checkpoint=final_ckpt, branch_checkpoints=branches, metrics=summary, curve=curve,
    )


def _phase(spec: SegmentSpec, tokens: int) -> str:
    """warmup, stable or decay: recorded in the checkpoint sidecar."""
    assert spec.schedule is not None
    if tokens < spec.schedule.warmup_tokens:
        return "warmup"
    if spec.schedule.kind == "cosine" or (spec.decay_start_tokens is not None and tokens > spec.decay_start_tokens):
        return "decay"
    return "stable"
