"""The dense_import segment on the built-in corpus: an imported dense model becomes a checkpoint at its D1 (the model
as the sweep uses it, context included) whose validation loss is measured on the sweep's data, and weights changed
after planning are refused rather than silently measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from upscale.sweeps.model_dirs import weights_fingerprint
from upscale.sweeps.segments import DataSpec, DenseImportSpec, ModelSpec, SegmentRuntime, SegmentSpec
from upscale.workers.checkpoints import tag_for
from upscale.workers.data import load_tokens
from upscale.workers.errors import WorkerError
from upscale.workers.evaluate import val_loss
from upscale.workers.model import ModelConfig, build_model
from upscale.workers.segment import run_segment
from upscale.workers.weights import load_model, save_model

D1 = 8192
IMPORTED = ModelConfig(n_layer=2, d_model=32, n_head=2, vocab_size=256, context=64)
DATA = DataSpec(eval_tokens=1024)


def import_segment(path: Path) -> SegmentSpec:
    model = ModelSpec(n_layer=2, d_model=32, n_head=2, vocab_size=256, context=32)
    source = DenseImportSpec(path=str(path), fingerprint=weights_fingerprint(path))
    return SegmentSpec(kind="dense_import", model=model, data=DATA, dense_import=source, start_tokens=D1,
                       end_tokens=D1)


def test_an_imported_model_becomes_a_checkpoint_at_d1_with_its_validation_loss(tmp_path: Path) -> None:
    src = save_model(tmp_path / "imported", IMPORTED, build_model(IMPORTED, seed=3).state_dict())
    (src / "source.json").write_text(json.dumps({"hf": "/somewhere"}))
    spec = import_segment(src)
    runtime = SegmentRuntime(checkpoint_dir=str(tmp_path / "seg"), data_cache_dir=str(tmp_path / "cache"))
    result = run_segment(spec, runtime)
    ckpt = Path(result.checkpoint)
    assert ckpt.name == tag_for(D1) and result.kind == "dense_import" and result.tokens == 0
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["segment_id"] == spec.id and meta["tokens"] == D1
    cfg, weights = load_model(ckpt / "model")
    assert cfg == IMPORTED.model_copy(update={"context": 32})  # the sweep's context; the rest as imported
    _, original = load_model(src)
    assert all(torch.equal(weights[k], original[k]) for k in original)
    assert (ckpt / "model" / "source.json").is_file()
    model = build_model(cfg, seed=0)
    model.load_state_dict(original)
    data = load_tokens(DATA, 32, tmp_path / "cache")
    assert result.val_loss == pytest.approx(val_loss(model, data.val_batches(1024, 32, 4), "cpu"), rel=1e-5)
    assert result.curve == [(D1, result.val_loss)]  # its one validation, at its D1


def test_weights_changed_after_planning_are_refused(tmp_path: Path) -> None:
    src = save_model(tmp_path / "imported", IMPORTED, build_model(IMPORTED, seed=3).state_dict())
    spec = import_segment(src)
    save_model(src, IMPORTED, build_model(IMPORTED, seed=4).state_dict())
    runtime = SegmentRuntime(checkpoint_dir=str(tmp_path / "seg"), data_cache_dir=str(tmp_path / "cache"))
    with pytest.raises(WorkerError, match="changed since the sweep was planned"):
        run_segment(spec, runtime)
    assert not (tmp_path / "seg" / tag_for(D1)).exists()


def test_a_servers_worker_refuses_model_files_linked_out_of_the_data_roots(tmp_path: Path) -> None:
    """Defence in depth, as for the corpus: planned under the roots, then its provenance file linked out of them (to
    a file, or nowhere) before the worker ran; with the server's roots it refuses both alike and writes nothing."""
    root = tmp_path / "root"
    src = save_model(root / "imported", IMPORTED, build_model(IMPORTED, seed=3).state_dict())
    spec = import_segment(src)
    (tmp_path / "secret.json").write_text("{}")
    messages = []
    for target in (tmp_path / "secret.json", tmp_path / "missing.json"):
        (src / "source.json").unlink(missing_ok=True)
        (src / "source.json").symlink_to(target)
        runtime = SegmentRuntime(checkpoint_dir=str(tmp_path / "seg"), data_cache_dir=str(tmp_path / "cache"),
                                 data_roots=(str(root),))
        with pytest.raises(WorkerError) as e:
            run_segment(spec, runtime)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and messages[0].startswith("model.dense.path: must be an absolute path under")
    assert not (tmp_path / "seg" / tag_for(D1)).exists()
