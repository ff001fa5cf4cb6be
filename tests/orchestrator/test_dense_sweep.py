"""A real micro sweep from an imported dense model on embedded Ray with the real worker (torch, DeepSpeed-MoE), all
of it from the Hugging Face world: a `transformers` Llama (GQA, a non-4x FFN) imported with `upscale model import`,
a `datasets` corpus saved with `save_to_disk`, and a Hugging Face tokenizer folder. The model is measured once as the
dense observation at its D1, upcycled (naive top-1, which preserves its function) and trained as an MoE, and its
shape trains from scratch."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.hf_data import dataset, hf_llama, tokenizer_folder
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.sweeps.data_sources import vocab_size_of
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import DataSpec
from upscale.sweeps.spec import parse_spec

pytestmark = pytest.mark.usefixtures("ray_session")
D1 = 4096


@pytest.mark.slow  # a real sweep of an imported HF model on HF data, trained: ~35 s on 2 cores
def test_a_sweep_from_an_imported_hf_model_on_hf_data_gives_dense_upcycled_and_scratch_observations(
        settings, tmp_path) -> None:
    from upscale.workers.hf_models import import_hf

    tokenizer = tokenizer_folder(tmp_path / "tokenizer")
    corpus = tmp_path / "corpus"
    dataset().save_to_disk(str(corpus))
    vocab = vocab_size_of(DataSpec(tokenizer=str(tokenizer)))
    import_hf(hf_llama(tmp_path / "hf", vocab_size=vocab), tmp_path / "imported")
    spec = parse_spec({
        "name": "imported", "model": {"dense": {"path": str(tmp_path / "imported"), "trained_tokens": D1,
                                                "name": "mine"}},
        "moe": {"experts": [2], "topk": [1]}, "upcycling": {"methods": ["naive"]},
        "tokens": {"d2": [256], "scratch": [256]},
        "data": {"corpus": str(corpus), "text_field": "body", "tokenizer": str(tokenizer), "eval_tokens": 256},
        "train": {"context": 16, "batch_size": 4, "lr": {"moe": 2e-3}, "warmup_tokens": 64}, "resources": {"cpus": 1}})
    orch = Orchestrator.open(settings)
    out = orch.run(spec, Scheduler(orch.store, orch.settings, poll_s=0.05))
    p = plan(spec)
    assert out.status == "done" and sorted(out.trained) == sorted(s.id for s in p.segments)
    assert p.by_kind() == {"dense_import": 1, "upcycle": 1, "moe_trunk": 1, "moe_decay": 1, "scratch_trunk": 1,
                           "scratch_decay": 1}
    assert all(s.spec.data.fingerprint and s.spec.model.n_kv_head == 2 and s.spec.model.d_ff == 72
               for s in p.segments)  # the data's content and the imported shape are in every key
    obs = {o.kind: o for o in orch.store.observations(out.sweep_id)}
    assert Counter(o.kind for o in orch.store.observations(out.sweep_id)) == {"dense": 1, "upcycled": 1,
                                                                             "scratch": 1}
    dense, upcycled = obs["dense"], obs["upcycled"]
    assert dense.D1 == dense.D == D1 and upcycled.D1 == D1 and upcycled.D2 == 256
    assert dense.N1 == upcycled.N1 == obs["scratch"].N1
    (imported,) = [s for s in p.segments if s.spec.kind == "dense_import"]
    (trunk,) = [s for s in p.segments if s.spec.kind == "moe_trunk"]
    assert dense.trunk == imported.id and upcycled.trunk == trunk.id
    # Naive top-1 upcycling preserves the function: the MoE starts at the imported model's validation loss.
    start = orch.store.segment(trunk.id).result["metrics"]["val_loss_start"]
    assert start == pytest.approx(dense.loss, rel=1e-4)
    ckpt = Path(orch.store.segment(imported.id).result["checkpoint"])
    assert json.loads((ckpt / "model" / "config.json").read_text())["context"] == 16
