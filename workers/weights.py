"""The model directory format: `config.json` (a ModelConfig) + `weights.pt` (its state dict), shape-checked.

One format for every model upscale hands between jobs (the decayed dense model an upcycle segment starts from,
the upcycled MoE, `upscale model init`). Loading checks every key and shape against the model the config
builds, so a checkpoint of the wrong size fails here with the tensor's name, not deep inside `load_state_dict`.
Tensors are loaded with `weights_only=True` (no pickled code runs).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from upscale.sweeps.model_dirs import read_json_object
from upscale.workers.errors import WorkerError, validated
from upscale.workers.model import ModelConfig, UpscaleLM, empty_model

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.pt"


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every state-dict key of `build_model(cfg)` and its shape (built on the meta device: no memory)."""
    return {k: tuple(v.shape) for k, v in empty_model(cfg, "meta").state_dict().items()}


def check_state_dict(cfg: ModelConfig, state_dict: dict[str, torch.Tensor], what: str = "checkpoint") -> None:
    """Raise a WorkerError naming the first missing/unexpected key or mismatched shape."""
    expected = expected_shapes(cfg)
    missing = sorted(set(expected) - set(state_dict))
    extra = sorted(set(state_dict) - set(expected))
    kind = f"MoE {cfg.n_expert}x top-{cfg.topk}" if cfg.is_moe else "dense"
    if missing or extra:
        raise WorkerError(
            f"{what} does not match a {kind} model with n_layer={cfg.n_layer} d_model={cfg.d_model}: "
            f"{len(missing)} missing keys {missing[:3]}, {len(extra)} unexpected keys {extra[:3]}"
        )
    for k, shape in expected.items():
        got = tuple(state_dict[k].shape)
        if got != shape:
            raise WorkerError(f"{what} tensor {k} has shape {got}; the config expects {shape}")


def save_model(path: str | Path, cfg: ModelConfig, state_dict: dict[str, torch.Tensor]) -> Path:
    """Write `path/config.json` and `path/weights.pt` (each written to a temporary name, then renamed)."""
    check_state_dict(cfg, state_dict, what="state dict to save")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (WEIGHTS_FILE + ".tmp")
    torch.save({k: v.detach().cpu().contiguous() for k, v in state_dict.items()}, tmp)
    os.replace(tmp, out / WEIGHTS_FILE)
    tmp = out / (CONFIG_FILE + ".tmp")
    tmp.write_text(cfg.model_dump_json(indent=2) + "\n")
    os.replace(tmp, out / CONFIG_FILE)
    return out


def load_model(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a model directory written by `save_model`; WorkerError if it is missing, malformed or mis-shaped."""
    src = Path(path)
    cfg_file, w_file = src / CONFIG_FILE, src / WEIGHTS_FILE
    for f in (cfg_file, w_file):
        if not f.is_file():
            raise WorkerError(f"{src} is not a model directory: {f.name} is missing (expected {CONFIG_FILE} + "
                              f"{WEIGHTS_FILE}, as written by `upscale model init`)")
    cfg = validated(ModelConfig, **read_json_object(cfg_file, WorkerError))
    try:
        state_dict = torch.load(w_file, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a corrupt or foreign file
        raise WorkerError(f"{w_file} is not a readable torch state dict: {e}") from None
    if not isinstance(state_dict, dict):
        raise WorkerError(f"{w_file} must hold a dict of tensors, got {type(state_dict).__name__}")
    check_state_dict(cfg, state_dict, what=str(w_file))
    return cfg, state_dict


def instantiate(cfg: ModelConfig, state_dict: dict[str, torch.Tensor]) -> UpscaleLM:
    """The model of `cfg` holding `state_dict` (copied in place, so DeepSpeed's expert attributes survive)."""
    check_state_dict(cfg, state_dict)
    model = empty_model(cfg)
    model.load_state_dict(state_dict)
    return model
