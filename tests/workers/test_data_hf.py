"""Hugging Face data in the worker: a save_to_disk corpus tokenised with a Hugging Face tokenizer (a folder or a
tokenizer.json) lands in the token cache with the tokenizer's own ids and vocabulary, streamed with progress; the
cache is keyed by content (the same files elsewhere share it); data changed since planning is refused; bad input
fails with one clear message; a dense model trains on such data."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.hf_data import DOCS, dataset, tokenizer_folder, tokenizer_json, train_tokenizer
from upscale.sweeps.data_sources import resolve_data, vocab_size_of
from upscale.sweeps.segments import DataSpec, ModelSpec, OptimSpec, ScheduleSpec, SegmentRuntime, SegmentSpec
from upscale.workers.data import load_tokens
from upscale.workers.errors import WorkerError
from upscale.workers.segment import run_segment


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    dataset().save_to_disk(root / "corpus")
    tokenizer_folder(root / "tok")
    tokenizer_json(root / "tokjson")
    return root


def test_hf_tokenizer_folder_and_file_tokenise_as_the_tokenizer_does(hf: Path, tmp_path: Path) -> None:
    expected = train_tokenizer()
    for tok in (hf / "tok", hf / "tokjson" / "tokenizer.json"):
        spec = DataSpec(corpus=str(hf / "corpus"), text_field="body", tokenizer=str(tok), eval_tokens=100)
        seen: list[tuple[int, int]] = []
        data = load_tokens(spec, 8, tmp_path / "cache", progress=lambda d, t, seen=seen: seen.append((d, t)))
        assert data.vocab_size == vocab_size_of(spec) == expected.get_vocab_size(with_added_tokens=True)
        assert seen[0] == (0, 0) and seen[-1] == (len(DOCS), len(DOCS))
        ids = [expected.encode(d).ids for d in DOCS]
        assert all(i[0] == expected.token_to_id("<s>") for i in ids)  # the tokenizer's BOS, as it defines it
        assert len(data.train) + len(data.val) == sum(len(i) for i in ids)
        assert sorted(np.concatenate([data.train, data.val]).tolist()) == sorted(t for i in ids for t in i)


def test_the_cache_is_keyed_by_content_and_refuses_data_changed_since_planning(hf: Path, tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere"
    shutil.copytree(hf / "corpus", copy / "corpus")
    shutil.copytree(hf / "tok", copy / "tok")
    here = resolve_data(DataSpec(corpus=str(hf / "corpus"), text_field="body", tokenizer=str(hf / "tok"),
                                 eval_tokens=100), tmp_path / "cache")
    there = resolve_data(DataSpec(corpus=str(copy / "corpus"), text_field="body", tokenizer=str(copy / "tok"),
                                  eval_tokens=100), tmp_path / "cache")
    first = load_tokens(here, 8, tmp_path / "cache")
    seen: list[tuple[int, int]] = []
    again = load_tokens(there, 8, tmp_path / "cache", progress=lambda d, t, seen=seen: seen.append((d, t)))
    assert again.cache_dir == first.cache_dir and not seen  # the same files elsewhere: the same cache, not rebuilt
    dataset(DOCS[:30]).save_to_disk(tmp_path / "changed")
    shutil.rmtree(copy / "corpus")
    shutil.copytree(tmp_path / "changed", copy / "corpus")
    with pytest.raises(WorkerError, match="changed since the sweep was planned"):
        load_tokens(there.model_copy(update={"eval_tokens": 99}), 8, tmp_path / "cache")


def test_bad_corpora_and_tokenizers_are_one_clear_error_each(hf: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.jsonl").write_text("")
    (tmp_path / "no-tok").mkdir()
    (tmp_path / "no-tok" / "config.json").write_text("{}")
    corpus = str(hf / "corpus")
    cases = [
        (DataSpec(corpus=str(tmp_path / "empty")), "is empty"),
        (DataSpec(corpus=str(tmp_path / "empty" / "*.parquet")), "matches no file"),
        (DataSpec(corpus="HuggingFaceFW/fineweb"),
         r"does not exist \(a relative path, from .*\); nothing is downloaded from a hub: download it"),
        (DataSpec(corpus="https://example.org/c.jsonl"), "not a local path"),
        (DataSpec(corpus=corpus, text_field="body", tokenizer=str(tmp_path / "no-tok")), "holds no tokenizer"),
        (DataSpec(corpus=corpus, text_field="body", tokenizer="meta-llama/Llama-3.2-1B"), "neither bytes, bpe nor"),
        (DataSpec(corpus=corpus), r"no column 'text'; columns: \['body', 'id'\]"),
    ]
    for spec, message in cases:
        with pytest.raises(WorkerError, match=message):
            load_tokens(spec, 8, tmp_path / "cache")


def test_a_dense_model_trains_on_a_saved_dataset_with_a_hf_tokenizer(hf: Path, tmp_path: Path) -> None:
    """The planner's data (fingerprinted, vocabulary from the tokenizer) through run_segment: the loss falls from
    about ln(vocab), so the tokens are the tokenizer's and fit the model's embedding."""
    data = resolve_data(DataSpec(corpus=str(hf / "corpus"), text_field="body", tokenizer=str(hf / "tok"),
                                 eval_tokens=256), tmp_path / "cache")
    tps = 8 * 16
    spec = SegmentSpec(kind="dense_decay", model=ModelSpec(n_layer=1, d_model=32, n_head=2, context=16,
                                                           vocab_size=vocab_size_of(data)),
                       data=data, optim=OptimSpec(lr=1e-2, batch_size=8), schedule=ScheduleSpec(warmup_tokens=2 * tps),
                       end_tokens=24 * tps, decay_start_tokens=20 * tps)
    result = run_segment(spec, SegmentRuntime(checkpoint_dir=str(tmp_path / "ckpt"),
                                              data_cache_dir=str(tmp_path / "cache")))
    assert result.metrics["val_loss_start"] == pytest.approx(math.log(300), abs=0.3)
    assert result.val_loss < result.metrics["val_loss_start"] - 1.0
