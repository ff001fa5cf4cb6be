"""Sweeps that start from an imported dense model (`model.dense`): the plan, the dense_import segment's identity, and
every bad input as a SpecError naming its field.

Strategy: the planner reads a model directory without torch (config.json, and the weights file's bytes for the
fingerprint), so these tests write one as plain files: a ModelConfig-shaped config.json and weights.pt bytes."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.sweeps.conftest import SMALL_SPEC
from upscale.sweeps.planner import plan, segment_seconds
from upscale.sweeps.sizes import dense_params
from upscale.sweeps.spec import SpecError, parse_spec, segment_bound

CONFIG = {"n_layer": 2, "d_model": 64, "n_head": 4, "vocab_size": 256, "context": 256, "n_expert": 0, "topk": 0,
          "rope_theta": 10000.0}


def model_dir(path: Path, weights: bytes = b"weights v1", **config) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**CONFIG, **config}))
    (path / "weights.pt").write_bytes(weights)
    return path


def dense_spec(path: Path, trained_tokens: int = 40960, **dense) -> dict:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["model"] = {"dense": {"path": str(path), "trained_tokens": trained_tokens, **dense}}
    del spec["tokens"]["d1"]
    spec["tokens"]["scratch"] = [40960]
    spec["upcycling"]["methods"] = ["naive", "drop"]
    spec["train"]["lr"] = {"moe": 2e-3}
    return spec


def problems(data: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as e:
        parse_spec(data)
    return dict(e.value.problems)


def test_the_plan_upcycles_the_imported_model_and_trains_no_dense_model(tmp_path) -> None:
    spec = parse_spec(dense_spec(model_dir(tmp_path / "m"), name="mine"))
    p = plan(spec)
    assert p.by_kind() == {"dense_import": 1, "upcycle": 2, "moe_trunk": 4, "moe_decay": 4, "scratch_trunk": 1,
                           "scratch_decay": 1}
    assert len(p.segments) <= segment_bound(spec)
    (imported,) = [s for s in p.segments if s.spec.kind == "dense_import"]
    dense_n = dense_params(spec.model.dense_model.shape)
    assert imported.flops == 0 and imported.observation.kind == "dense"
    obs = imported.observation
    assert dense_n == obs.N1 and obs.D1 == obs.D == 40960
    assert imported.spec.start_tokens == imported.spec.end_tokens == 40960
    assert imported.spec.model.context == 128 and imported.spec.model.vocab_size == 256  # as the sweep uses it
    for s in p.segments:
        assert (s.spec.model.n_layer, s.spec.model.d_model, s.spec.model.n_head) == (2, 64, 4)  # the imported shape
        assert s.axes["size"] == "mine"
    upcycles = [s for s in p.segments if s.spec.kind == "upcycle"]
    assert all(s.spec.parent_ids == (imported.id,) and s.trunk == imported.id for s in upcycles)
    assert {o.observation.D1 for o in p.observations() if o.observation.kind == "upcycled"} == {40960}
    assert segment_seconds(p)[imported.id] > segment_seconds(p, tokens_per_s=1e12)[imported.id] > 0


def test_the_same_weights_elsewhere_are_the_same_segment_and_changed_weights_a_new_one(tmp_path) -> None:
    def import_id(path: Path, **dense) -> str:
        return next(s.id for s in plan(parse_spec(dense_spec(path, **dense))).segments if s.spec.kind == "dense_import")

    first = model_dir(tmp_path / "a")
    key = import_id(first)
    copy_ = tmp_path / "elsewhere" / "b"
    shutil.copytree(first, copy_)
    assert import_id(copy_) == key
    assert import_id(first, trained_tokens=81920) != key  # D1 is identity too
    (first / "weights.pt").write_bytes(b"weights v2")
    os.utime(first / "weights.pt", ns=(1, 1))  # same size as before: the new mtime alone makes it hashed again
    assert import_id(first) != key


def test_bad_inputs_name_their_field(tmp_path) -> None:
    good = model_dir(tmp_path / "m")
    assert "model.dense.path" in problems(dense_spec(tmp_path / "missing"))
    assert "no model directory" in problems(dense_spec(tmp_path / "missing"))["model.dense.path"]
    (tmp_path / "empty").mkdir()
    msg = problems(dense_spec(tmp_path / "empty"))["model.dense.path"]
    assert "not an upscale model directory" in msg and "config.json" in msg and "upscale model import" in msg
    moe = model_dir(tmp_path / "moe", n_expert=4, topk=1)
    assert "dense model" in problems(dense_spec(moe))["model.dense.path"]
    bad_shape = model_dir(tmp_path / "shape", n_head=5)
    assert "n_head" in problems(dense_spec(bad_shape))["model.dense.path"]

    short = dense_spec(model_dir(tmp_path / "short", context=64))
    assert "exceeds the context" in problems(short)["train.context"]
    bpe = dense_spec(good)
    bpe["data"] = {"tokenizer": "bpe", "bpe_vocab_size": 512}
    msg = problems(bpe)["data.tokenizer"]
    assert "512" in msg and "vocab_size=256" in msg
    vocab = dense_spec(good)
    vocab["model"]["vocab_size"] = 300
    assert "model.vocab_size" in problems(vocab)

    both = dense_spec(good)
    both["model"]["sizes"] = ["nano"]
    assert "exactly one of model.sizes" in problems(both)["model"]
    neither = dense_spec(good)
    del neither["model"]["dense"]
    assert "exactly one of model.sizes" in problems(neither)["model"]
    d1 = dense_spec(good)
    d1["tokens"]["d1"] = [20480]
    assert "trained_tokens" in problems(d1)["tokens.d1"]
    assert "model.dense.trained_tokens" in problems(dense_spec(good, trained_tokens=0))


def test_a_spec_of_sizes_still_needs_its_dense_budgets_and_lr(spec_data) -> None:
    del spec_data["tokens"]["d1"]
    spec_data["train"]["lr"] = {"moe": 2e-3}
    found = problems(spec_data)
    assert "D1" in found["tokens.d1"] and "dense" in found["train.lr.dense"]


def test_check_path_runs_before_the_directory_is_read(tmp_path) -> None:
    seen = []

    def refuse(path: str) -> None:
        seen.append(path)
        raise ValueError("must be under the data roots")

    for path in (model_dir(tmp_path / "m"), tmp_path / "missing"):
        with pytest.raises(SpecError) as e:
            parse_spec(dense_spec(path), check_path=refuse)
        assert e.value.problems == (("model.dense.path", "must be under the data roots"),)
    assert seen == [str(tmp_path / "m"), str(tmp_path / "missing")]
