"""Segment checkpoints: a DeepSpeed checkpoint (weights + optimiser, experts in their own files) plus a JSON sidecar.

Layout under a segment's `checkpoint_dir`: one folder per saved token count, `tokens_<15 digits>/`, holding
DeepSpeed's files (`engine.save_checkpoint(dir, tag)`), a `model/` export in the `workers.weights` format (the
weights alone, what an upcycle segment or `upscale model` reads), and `meta.json` (segment id,
parents, tokens, schedule phase, the full ModelConfig, the expert-parallel size of the engine state,
schema_version). `meta.json` is written last, atomically: a folder without it is an interrupted save and is never
resumed from. Resume = the newest complete folder whose sidecar names this segment. These functions work on local
folders (DeepSpeed's); `upscale.storage` publishes them to a URI and fetches them back, with the same rule.

A complete folder whose files cannot be read (truncated, overwritten, lost) is `corrupt`: a WorkerError, which the
scheduler never retries, naming the file and the segment that wrote it, whose retraining
`upscale segments invalidate` asks for.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from upscale import storage
from upscale.storage import META_FILE, TAG_PREFIX
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig
from upscale.workers.parallel import SINGLE, Ranks, full_state_dict
from upscale.workers.weights import load_model, save_model

SCHEMA_VERSION = 1
MODEL_DIR = "model"


def tag_for(tokens: int) -> str:
    return f"{TAG_PREFIX}{tokens:015d}"


def save(engine, root: str | Path, tokens: int, cfg: ModelConfig, meta: dict[str, Any], ep_size: int = 1,
         ranks: Ranks = SINGLE) -> Path:
    """Save engine state + weights export at `tokens`; returns the checkpoint folder.

    On several ranks every rank calls this: DeepSpeed writes each rank's experts and optimiser shard, the full
    model is gathered for the export, and rank 0 writes the export and, once every rank is done, the sidecar."""
    root = Path(root)
    tag = tag_for(tokens)
    engine.save_checkpoint(str(root), tag=tag, client_state={"tokens": tokens})
    path = root / tag
    weights = full_state_dict(engine.module, cfg, ep_size)
    if ranks.main:
        save_model(path / MODEL_DIR, cfg, weights)
    ranks.barrier()  # every rank's DeepSpeed files are on disk before the sidecar marks the folder complete
    if ranks.main:
        write_meta(path, {**meta, "tokens": tokens, "ep_size": ep_size}, cfg)
    ranks.barrier()
    return path


def write_meta(path: str | Path, meta: dict[str, Any], cfg: ModelConfig) -> None:
    """Write the sidecar last and atomically: its presence marks the folder as a complete checkpoint."""
    body = {**meta, "schema_version": SCHEMA_VERSION, "model_config": cfg.model_dump()}
    tmp = Path(path) / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True))
    os.replace(tmp, Path(path) / META_FILE)


def model_dir(path: str | Path) -> Path:
    """The weights of a checkpoint folder (`<path>/model`), or `path` itself when it is a bare model folder."""
    path = Path(path)
    return path / MODEL_DIR if (path / MODEL_DIR).is_dir() else path


def has_engine_state(path: str | Path) -> bool:
    """True for a DeepSpeed checkpoint (weights + optimiser), False for a weights-only export (an upcycled MoE)."""
    return (Path(path) / "mp_rank_00_model_states.pt").is_file()


def corrupt(path: str | Path, what: str | Path, cause: object) -> WorkerError:
    """The error for checkpoint folder ``path`` whose file ``what`` cannot be read: retrying reads the same bytes, so
    it names the segment that wrote the folder (its sidecar's, else the folder it sits in) and how to retrain it."""
    try:
        writer = json.loads((Path(path) / META_FILE).read_text())["segment_id"]
    except (OSError, ValueError, KeyError, TypeError):
        writer = Path(path).parent.name  # <checkpoint root>/<segment id>/tokens_*
    return WorkerError(f"checkpoint file {what} is corrupt or unreadable ({cause}); retrying cannot help: "
                       f"`upscale segments invalidate {writer}` retrains segment {writer} and what was trained from it")


def read_meta(path: str | Path) -> dict[str, Any]:
    """The sidecar of a checkpoint folder; a clear error when the folder is not a complete checkpoint."""
    f = Path(path) / META_FILE
    if not f.is_file():
        raise WorkerError(f"{path} is not a complete segment checkpoint ({META_FILE} missing)")
    try:
        meta = json.loads(f.read_text())
    except (OSError, ValueError) as e:  # garbage or a cut-off write: ValueError covers JSON and UTF-8 errors
        raise corrupt(path, f, e) from None
    if not isinstance(meta, dict):
        raise corrupt(path, f, f"a JSON {type(meta).__name__}, not an object")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise WorkerError(f"{f}: checkpoint schema_version {meta.get('schema_version')} is not {SCHEMA_VERSION}")
    return meta


def check_same_model(meta: dict[str, Any], cfg: ModelConfig, where: str | Path) -> None:
    """Refuse a checkpoint of another model: names every field that differs. A field the sidecar lacks predates the
    option (`balancing`, say) and so was trained at its default."""
    saved = {k: f.default for k, f in type(cfg).model_fields.items()} | meta["model_config"]
    want = cfg.model_dump()
    diff = {k: (saved.get(k), v) for k, v in want.items() if saved.get(k) != v}
    if diff:
        detail = ", ".join(f"{k}: checkpoint {a!r} vs segment {b!r}" for k, (a, b) in sorted(diff.items()))
        raise WorkerError(f"checkpoint {where} is of a different model shape ({detail})")


def load(engine, path: str | Path, cfg: ModelConfig, ep_size: int = 1) -> dict[str, Any]:
    """Restore weights and optimiser state from a checkpoint folder after checking its model and its expert
    partition (an MoE's optimiser state is sharded by ep_size); returns its meta."""
    path = Path(path)
    meta = read_meta(path)
    check_same_model(meta, cfg, path)
    saved_ep = meta.get("ep_size", 1)
    if cfg.is_moe and saved_ep != ep_size:
        raise WorkerError(f"checkpoint {path} holds MoE optimiser state sharded over ep_size={saved_ep} (trained "
                          f"with a worker count w where gcd(w, n_expert)={saved_ep}); this run has ep_size={ep_size}. "
                          f"Train this segment with the same resources.workers as its parent, or retrain the parent")
    try:
        loaded, _ = engine.load_checkpoint(str(path.parent), tag=path.name, load_optimizer_states=True,
                                           load_lr_scheduler_states=False, load_module_strict=True)
    except Exception as e:  # torch and DeepSpeed raise many types for a truncated or foreign file
        raise corrupt(path, path, f"DeepSpeed: {type(e).__name__}: {e}") from None
    if loaded is None:
        raise corrupt(path, path, "DeepSpeed found no checkpoint in it")
    return meta


def load_weights(path: str | Path) -> tuple[ModelConfig, dict[str, Any]]:
    """The weights export of a checkpoint folder (or a bare model folder), as `workers.weights.load_model` reads it;
    a file that is missing or unreadable there is `corrupt`."""
    try:
        return load_model(model_dir(path))
    except WorkerError as e:
        raise corrupt(path, model_dir(path), e) from None


def complete(root: str | Path, segment_id: str) -> dict[int, Path]:
    """Complete checkpoints of `segment_id` under the folder `root`, by token count."""
    return {tokens: Path(p) for tokens, p in storage.complete(Path(root), segment_id).items()}
