"""Data: every corpus format yields its documents, the token cache is built once and split by document, batches are
a pure function of (seed, step), BPE trains and caches, and bad corpora fail with a clear message."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import DatasetDict

from tests.hf_data import DOCS, dataset
from upscale.sweeps.segments import DataSpec
from upscale.workers.data import BUILTIN_STDLIB, iter_documents, load_tokens
from upscale.workers.errors import WorkerError


def test_folder_files_globs_and_save_to_disk_give_the_same_documents(tmp_path: Path) -> None:
    folder = tmp_path / "txt"
    folder.mkdir()
    for i, d in enumerate(DOCS):
        (folder / f"{i:03d}.txt").write_text(d)
    ds = dataset(DOCS)
    ds.to_json(tmp_path / "c.jsonl")
    ds.to_parquet(tmp_path / "c.parquet")
    (tmp_path / "c.json").write_text(json.dumps([{"body": d} for d in DOCS]))
    ds.save_to_disk(tmp_path / "hf")
    DatasetDict({"a": dataset(DOCS[:25]), "b": dataset(DOCS[25:])}).save_to_disk(tmp_path / "splits")
    (tmp_path / "shards").mkdir()
    dataset(DOCS[:25]).to_parquet(tmp_path / "shards" / "part-0.parquet")
    dataset(DOCS[25:]).to_parquet(tmp_path / "shards" / "part-1.parquet")
    (tmp_path / "para.txt").write_text("\n\n".join(DOCS) + "\n")  # a .txt file: one document per paragraph
    assert list(iter_documents(DataSpec(corpus=str(folder)))) == DOCS
    for src in ("c.jsonl", "c.parquet", "c.json", "hf", "splits", "shards/*.parquet", "shards/**/*.parquet"):
        assert list(iter_documents(DataSpec(corpus=str(tmp_path / src), text_field="body"))) == DOCS, src
    assert [d.strip() for d in iter_documents(DataSpec(corpus=str(tmp_path / "para.txt")))] == [d.strip() for d in DOCS]
    for src in ("c.jsonl", "hf", "shards/*.parquet"):  # a missing text field names the columns there are
        with pytest.raises(WorkerError, match=r"no column 'text'; columns: \['body', 'id'\]; set data.text_field"):
            list(iter_documents(DataSpec(corpus=str(tmp_path / src))))


def test_missing_and_empty_corpora_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(WorkerError, match="does not exist"):
        load_tokens(DataSpec(corpus=str(tmp_path / "nope")), 16, tmp_path / "cache")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    with pytest.raises(WorkerError, match="is empty"):
        load_tokens(DataSpec(corpus=str(tmp_path / "empty")), 16, tmp_path / "cache")


def test_cache_split_by_document_and_batches_pure(tmp_path: Path) -> None:
    folder = tmp_path / "txt"
    folder.mkdir()
    for i, d in enumerate(DOCS):
        (folder / f"{i:03d}.txt").write_text(d)
    spec = DataSpec(corpus=str(folder), eval_tokens=500)
    data = load_tokens(spec, 16, tmp_path / "cache")
    total = sum(len(d.encode()) for d in DOCS)
    assert len(data.train) + len(data.val) == total
    assert 501 <= len(data.val) < 501 + max(len(d) for d in DOCS)  # whole documents until eval_tokens + 1
    val_text = bytes(np.asarray(data.val)).decode()
    val_docs = [d for d in DOCS if d in val_text]
    assert sum(len(d) for d in val_docs) == len(data.val)  # validation is made of whole documents only
    assert all(d not in bytes(np.asarray(data.train)).decode() for d in val_docs)
    again = load_tokens(spec, 16, tmp_path / "cache")  # second call: memory-mapped from the same cache folder
    assert again.cache_dir == data.cache_dir and np.array_equal(again.train, data.train)
    b1, b2 = data.batch(3, 7, 4, 16), data.batch(3, 7, 4, 16)
    assert b1.shape == (4, 17) and torch.equal(b1, b2)
    assert not torch.equal(b1, data.batch(3, 8, 4, 16))
    # The upcycled MoE's stream: reproducible, and not a replay of the dense parent's batches at the same step.
    assert torch.equal(data.batch(3, 7, 4, 16, stream=1), data.batch(3, 7, 4, 16, stream=1))
    assert not torch.equal(b1, data.batch(3, 7, 4, 16, stream=1))
    vb = data.val_batches(320, 16, 8)
    assert sum(b.shape[0] for b in vb) == 20 and torch.equal(vb[0][1, 0], vb[0][0, 16])  # consecutive windows


def test_bpe_is_trained_once_and_cached(tmp_path: Path) -> None:
    folder = tmp_path / "txt"
    folder.mkdir()
    for i, d in enumerate(DOCS):
        (folder / f"{i:03d}.txt").write_text(d)
    spec = DataSpec(corpus=str(folder), tokenizer="bpe", bpe_vocab_size=300, eval_tokens=100)
    data = load_tokens(spec, 8, tmp_path / "cache")
    assert 257 <= data.vocab_size <= 300
    assert int(np.max(data.train)) < data.vocab_size
    n_bytes = sum(len(d.encode()) for d in DOCS)
    assert len(data.train) + len(data.val) < 0.5 * n_bytes  # repetitive text compresses well under BPE
    saved = list((tmp_path / "cache" / "tokenizers").glob("bpe-*.json"))
    assert len(saved) == 1
    mtime = saved[0].stat().st_mtime_ns
    load_tokens(spec.model_copy(update={"eval_tokens": 50}), 8, tmp_path / "cache")
    assert saved[0].stat().st_mtime_ns == mtime  # the tokeniser was reused, not retrained


def test_builtin_stdlib_corpus(tmp_path: Path) -> None:
    data = load_tokens(DataSpec(corpus=BUILTIN_STDLIB, eval_tokens=4096), 32, tmp_path / "cache")
    assert data.vocab_size == 256 and len(data.train) > 5_000_000 and len(data.val) > 4096
    assert b"def " in bytes(np.asarray(data.val[:200_000]))


def test_a_servers_worker_refuses_a_corpus_file_linked_out_of_the_data_roots(tmp_path: Path) -> None:
    """Defence in depth: a file may be linked out of the roots after the server admitted the sweep. With the
    server's data roots, the worker refuses a link to an existing outside file and a dangling one alike, and no
    token cache is built; without them (the operator's own CLI) the link is read."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("private text " * 40)
    messages = []
    for name, target in (("exists", outside / "secret.txt"), ("dangling", outside / "missing.txt")):
        (root / name).mkdir(parents=True)
        (root / name / "only.txt").symlink_to(target)
        with pytest.raises(WorkerError) as e:
            load_tokens(DataSpec(corpus=str(root / name), eval_tokens=16), 8, tmp_path / "cache",
                        data_roots=[str(root)])
        messages.append(str(e.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith("data.corpus: must be a builtin: name or an absolute path under the data roots")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("*/meta.json"))
    assert list(iter_documents(DataSpec(corpus=str(root / "exists")))) == ["private text " * 40]
