"""The model directory format: a round trip is bit-exact, and every malformed directory is one clear WorkerError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, build_model
from upscale.workers.weights import CONFIG_FILE, WEIGHTS_FILE, instantiate, load_model, save_model


def test_round_trip_dense_and_moe(tmp_path: Path, dense_cfg: ModelConfig, dense_sd: dict, tokens: torch.Tensor) -> None:
    save_model(tmp_path / "d", dense_cfg, dense_sd)
    cfg, sd = load_model(tmp_path / "d")
    assert cfg == dense_cfg
    assert sd.keys() == dense_sd.keys() and all(torch.equal(sd[k], dense_sd[k]) for k in sd)
    moe_cfg = dense_cfg.updated(n_expert=4, topk=2, router_type="mixture")
    moe = build_model(moe_cfg, seed=3).eval()
    save_model(tmp_path / "m", moe_cfg, moe.state_dict())
    cfg, sd = load_model(tmp_path / "m")
    assert cfg == moe_cfg
    assert torch.equal(instantiate(cfg, sd).eval()(tokens)[0], moe(tokens)[0])


def test_wrong_shape_names_the_tensor(tmp_path: Path, dense_cfg: ModelConfig, dense_sd: dict) -> None:
    save_model(tmp_path, dense_cfg, dense_sd)
    bigger = dense_cfg.updated(d_model=64, n_head=4)
    (tmp_path / CONFIG_FILE).write_text(bigger.model_dump_json())
    with pytest.raises(WorkerError, match=r"tok_emb\.weight has shape \(64, 32\); the config expects \(64, 64\)"):
        load_model(tmp_path)


def test_missing_and_extra_keys(tmp_path: Path, dense_cfg: ModelConfig, dense_sd: dict) -> None:
    sd = dict(dense_sd)
    del sd["norm.weight"]
    with pytest.raises(WorkerError, match=r"1 missing keys \['norm.weight'\]"):
        save_model(tmp_path, dense_cfg, sd)
    moe_cfg = dense_cfg.updated(n_expert=2, topk=2)
    with pytest.raises(WorkerError, match=r"MoE 2x top-2 .* unexpected keys \['blocks.0.ffn.w_down.weight'"):
        save_model(tmp_path, moe_cfg, dense_sd)


def test_not_a_model_directory(tmp_path: Path, dense_cfg: ModelConfig, dense_sd: dict) -> None:
    with pytest.raises(WorkerError, match=r"config\.json is missing"):
        load_model(tmp_path)
    save_model(tmp_path, dense_cfg, dense_sd)
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**dense_cfg.model_dump(), "n_head": 3}))
    with pytest.raises(WorkerError, match="not divisible by n_head=3"):
        load_model(tmp_path)
    (tmp_path / CONFIG_FILE).write_text(dense_cfg.model_dump_json())
    (tmp_path / WEIGHTS_FILE).write_bytes(b"not a torch file")
    with pytest.raises(WorkerError, match="not a readable torch state dict"):
        load_model(tmp_path)
