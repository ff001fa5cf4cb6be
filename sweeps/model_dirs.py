"""Read an upscale model directory without torch: the shape a sweep plans from, and the weights' content fingerprint.

A model directory (workers/weights.py) is `config.json` (a ModelConfig as JSON) + `weights.pt`. A sweep that starts
from an imported dense model (`model: {dense: {path, trained_tokens}}`) reads its config here, at validation, and
keys its `dense_import` segment by the SHA-256 of the weights file rather than by the path: the same weights
anywhere give the same segment, changed weights a new one. Hashing a 0.1B model reads ~0.5 GB, so the digest is
remembered by the file's size and modification time (sweeps/data_sources.py `FileHashes`, as the corpus files').
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from upscale.sweeps.data_sources import FileHashes, default_cache_dir
from upscale.sweeps.segments import ModelSpec, Shape

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.pt"
SOURCE_FILE = "source.json"  # provenance of an imported model (workers/hf_models.py), copied along with it
# Config keys a sweep takes from an imported model: its decoder shape, and the ModelSpec options that change what
# it computes. Only those the installed Shape / ModelSpec define are passed on.
SHAPE_KEYS = ("n_layer", "d_model", "n_head", "ffn_width", "n_kv_head")
OPTION_KEYS = ("tie_embeddings", "norm_eps", "rope_theta")


class ModelDirError(ValueError):
    """A path that is not a dense upscale model directory; the message says what is wrong and how to make one."""


@dataclass(frozen=True)
class DenseModelDir:
    """What a sweep needs of an imported dense model: its shape, the ModelSpec options it was built with, its
    vocabulary and the longest context it was built for."""

    path: str
    shape: Shape
    options: tuple[tuple[str, object], ...]
    vocab_size: int
    context: int


def read_json_object(path: Path, error: type[ValueError] = ModelDirError) -> dict[str, Any]:
    """The JSON object a model's config file holds (upscale's `config.json`, or a Hugging Face one); ``error``
    naming the file when it is not valid JSON or not an object. Every reader of a model config reads it here."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object of model config fields")
    return data


def read_dense_model(path: str | Path) -> DenseModelDir:
    """The dense model at ``path``; ModelDirError if it is missing, not a model directory, or an MoE."""
    src = Path(path).expanduser()
    if not src.is_dir():
        raise ModelDirError(f"no model directory at {path}")
    cfg_file = src / CONFIG_FILE
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if not (src / f).is_file()]
    if missing:
        raise ModelDirError(f"{path} is not an upscale model directory ({', '.join(missing)} missing); write one with "
                            "`upscale model import --hf DIR --out MODEL` or `upscale model init`")
    fields = read_json_object(cfg_file)
    absent = [k for k in ("n_layer", "d_model", "n_head", "vocab_size", "context") if k not in fields]
    if absent:
        raise ModelDirError(f"{cfg_file} lacks {', '.join(absent)}")
    if fields.get("n_expert"):
        raise ModelDirError(f"{cfg_file}: n_expert={fields['n_expert']}; model.dense takes a dense model")
    try:
        shape = Shape(**{k: fields[k] for k in SHAPE_KEYS if k in fields and k in Shape.model_fields})
        options = tuple((k, fields[k]) for k in OPTION_KEYS if k in fields and k in ModelSpec.model_fields)
        ModelSpec(**shape.model_dump(), **dict(options), vocab_size=fields["vocab_size"], context=fields["context"])
    except ValidationError as e:
        err = e.errors()[0]
        raise ModelDirError(f"{cfg_file}: {'.'.join(map(str, err['loc'])) or 'shape'}: {err['msg']}") from None
    return DenseModelDir(str(path), shape, options, fields["vocab_size"], fields["context"])


def confine_model_files(path: str | Path, check: Callable[[str], object]) -> None:
    """``check`` (a server's confinement to its data roots, raising ValueError) on each file of the model directory
    at ``path`` that a sweep reads or copies, a dangling symlink included: a folder under the roots may hold links
    out of them."""
    src = Path(path).expanduser()
    for name in (CONFIG_FILE, WEIGHTS_FILE, SOURCE_FILE):
        if os.path.lexists(src / name):
            check(str(src / name))


def weights_fingerprint(path: str | Path) -> str:
    """SHA-256 of the model directory's weights file, remembered by its size and mtime like the corpus files'."""
    return FileHashes(default_cache_dir() / "fingerprints").sha256(Path(path).expanduser() / WEIGHTS_FILE)
