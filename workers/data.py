"""Corpus -> documents -> tokens in a memory-mapped cache -> batches that are a pure function of (seed, step).

Sources (`DataSpec.corpus`, laid out by `sweeps.data_sources.corpus_source`): `builtin:python-stdlib` (the running
Python's standard-library .py files, tests and site-packages excluded: ~11 MB of real text on every machine, no
download), a folder of text files (read recursively, one document per file), a Hugging Face dataset saved with
`save_to_disk` (`datasets.load_from_disk`; every split of a DatasetDict), or .parquet/.jsonl/.json/.txt/.csv files,
one path or a glob, streamed by `datasets.load_dataset` (a .txt file gives one document per blank-line-separated
paragraph). Tokenisers (`DataSpec.tokenizer`): UTF-8 bytes, a BPE trained on the corpus, or a Hugging Face tokenizer
(a folder or a tokenizer.json file; its special tokens are added to every document as it defines them).

Tokens are computed once per (data fingerprint, tokeniser) and stored as uint8/16/32 arrays under
`<cache>/<key>/{train,val}.bin`: documents are encoded a chunk at a time and streamed to disk, then split, in a
temporary folder that is renamed, so concurrent jobs never read a half cache. The fingerprint is the content hash the
planner put in the segment (`DataSpec.fingerprint`), checked against the files when the cache is built; the builtin
corpus is fingerprinted by its files' names, sizes and mtimes. Documents are shuffled with `data_seed` and the first
ones, up to `eval_tokens + 1` tokens, form the validation set: validation text never appears in training. A training
batch draws random windows from the train array with a generator seeded by (data_seed, step): a resumed run, or a
decay branch, sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from upscale.sweeps.data_sources import (
    BYTE_VOCAB,
    CorpusSource,
    corpus_source,
    default_cache_dir,
    resolve_data,
    tokenizer_path,
)
from upscale.sweeps.segments import BUILTIN_STDLIB, DataSpec
from upscale.sweeps.spec import SpecError
from upscale.workers.errors import WorkerError

__all__ = ["BUILTIN_STDLIB", "TokenData", "Tokenizer", "default_cache_dir", "iter_documents", "load_tokens"]

CACHE_VERSION = 1
ENCODE_CHUNK = 512  # documents per encode call: the grain of load_tokens' progress
DATASET_BATCH = 1024  # rows read from a dataset at a time


def _source(data: DataSpec) -> CorpusSource:
    try:
        return corpus_source(data.corpus)
    except SpecError as e:
        raise WorkerError(e.problems[0][1]) from None


# -- sources ----------------------------------------------------------------------------------------------


def _column_error(where: object, column: str, columns: Iterable[str]) -> WorkerError:
    return WorkerError(f"{where} has no column {column!r}; columns: {sorted(columns)}; set data.text_field")


def _saved_dataset_documents(source: CorpusSource, column: str) -> Iterator[str]:
    from datasets import DatasetDict, load_from_disk

    saved = load_from_disk(str(source.base))
    splits = [saved[name] for name in sorted(saved)] if isinstance(saved, DatasetDict) else [saved]
    for split in splits:
        if column not in split.column_names:
            raise _column_error(source.base, column, split.column_names)
        for rows in split.select_columns([column]).iter(batch_size=DATASET_BATCH):
            yield from (t for t in rows[column] if t)


def _data_files_documents(source: CorpusSource, column: str) -> Iterator[str]:
    from datasets import load_dataset

    options = {"sample_by": "paragraph"} if source.builder == "text" else {}
    rows = load_dataset(source.builder, data_files=[str(f) for f in source.files], split="train", streaming=True,
                        **options)
    if source.builder == "text":
        column = "text"  # the text builder's one column, whatever text_field says
    for n, row in enumerate(rows):
        if n == 0 and column not in row:
            where = source.files[0] if len(source.files) == 1 else f"{source.base} ({len(source.files)} files)"
            raise _column_error(where, column, row)
        if row.get(column):
            yield row[column]


def iter_documents(data: DataSpec) -> Iterator[str]:
    """Every document of the corpus as text, in a fixed order."""
    source = _source(data)
    if source.kind == "saved_dataset":
        yield from _saved_dataset_documents(source, data.text_column)
    elif source.kind == "data_files":
        yield from _data_files_documents(source, data.text_column)
    else:
        for f in source.files:
            text = f.read_text(encoding="utf-8", errors="replace")
            if text:
                yield text


def _document_count(data: DataSpec) -> int:
    """How many documents the corpus has, where that is known without reading it (0: not known)."""
    source = _source(data)
    if source.kind == "text_files":
        return len(source.files)
    if source.kind == "saved_dataset":
        from datasets import DatasetDict, load_from_disk

        saved = load_from_disk(str(source.base))
        return sum(len(s) for s in saved.values()) if isinstance(saved, DatasetDict) else len(saved)
    return 0


def corpus_fingerprint(data: DataSpec) -> str:
    """Hash of the corpus files' names, sizes and mtimes (and the text column): cheap, changes with the data. The
    key of data the planner left without a content fingerprint (the builtin corpus)."""
    h = hashlib.sha256(f"{data.corpus}|{data.text_column}".encode())
    for f in _source(data).files:
        st = f.stat()
        h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _content_fingerprint(data: DataSpec, cache_dir: Path, roots: Sequence[Path] | None = None) -> str | None:
    """The content fingerprint of ``data`` as its files are now (None for the builtin corpus with bytes/bpe); with
    ``roots``, WorkerError for a file outside them."""
    try:
        return resolve_data(data.model_copy(update={"fingerprint": None}), cache_dir, roots).fingerprint
    except SpecError as e:
        field, message = e.problems[0]
        raise WorkerError(f"{field}: {message}") from None


# -- tokenisers -------------------------------------------------------------------------------------------


class Tokenizer:
    """bytes: UTF-8 bytes as ids 0..255; bpe and hf: a `tokenizers` tokenizer (trained here, or a Hugging Face
    tokenizer.json); auto: a transformers tokenizer for a folder without tokenizer.json."""

    def __init__(self, kind: str, bpe=None, auto=None) -> None:  # bpe: tokenizers.Tokenizer; auto: transformers'
        self.kind = kind
        self.bpe = bpe
        self.auto = auto

    @property
    def vocab_size(self) -> int:
        """One more than the largest id (added tokens included): the embedding rows the model needs."""
        if self.auto is not None:
            return len(self.auto)
        if self.bpe is None:
            return BYTE_VOCAB
        return max(self.bpe.get_vocab(with_added_tokens=True).values()) + 1

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        if self.auto is not None:
            return [np.asarray(ids, dtype=np.int64) for ids in self.auto(texts)["input_ids"]]
        if self.bpe is None:
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
        return [np.asarray(e.ids, dtype=np.int64) for e in self.bpe.encode_batch(texts)]


def get_tokenizer(data: DataSpec, cache_dir: Path, fingerprint: str) -> Tokenizer:
    """The byte tokeniser, a Hugging Face tokenizer from its path, or the BPE trained on this corpus (trained once,
    cached by the corpus's `fingerprint` and the vocabulary size)."""
    if data.tokenizer == "bytes":
        return Tokenizer("bytes")
    from tokenizers import Tokenizer as HFTokenizer

    if data.tokenizer != "bpe":
        return _hf_tokenizer(data)
    from tokenizers import decoders, models, pre_tokenizers, trainers

    path = cache_dir / "tokenizers" / f"bpe-{fingerprint}-{data.bpe_vocab_size}.json"
    if not path.exists():
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=data.bpe_vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(iter_documents(data), trainer=trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tok.save(str(tmp))
        tmp.replace(path)
    return Tokenizer("bpe", HFTokenizer.from_file(str(path)))


def _hf_tokenizer(data: DataSpec) -> Tokenizer:
    """The tokenizer at the path `data.tokenizer` names: its tokenizer.json when it has one, else AutoTokenizer."""
    from tokenizers import Tokenizer as HFTokenizer

    try:
        path = tokenizer_path(data)
    except SpecError as e:
        raise WorkerError(e.problems[0][1]) from None
    assert path is not None
    file = path if path.is_file() else path / "tokenizer.json"
    if file.is_file():
        try:
            return Tokenizer("hf", HFTokenizer.from_file(str(file)))
        except Exception as e:  # (tokenizers raises a bare Exception for a malformed file)
            raise WorkerError(f"{file} is not a tokenizers tokenizer.json: {e}") from None
    from transformers import AutoTokenizer

    try:
        return Tokenizer("auto", auto=AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    except Exception as e:  # (transformers raises many kinds for an unloadable folder)
        raise WorkerError(f"tokenizer folder {str(path)!r} has no tokenizer.json and AutoTokenizer cannot load it: "
                          f"{type(e).__name__}") from None


# -- the token cache and batches --------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenData:
    """Train and validation token arrays (memory-mapped) and the tokeniser's vocabulary size."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    cache_dir: Path

    def batch(self, seed: int, step: int, batch_size: int, context: int, stream: int = 0) -> torch.Tensor:
        """[batch_size, context + 1] int64 windows of the train tokens; a pure function of (seed, step, stream).

        Stream 0 is the dense models' (and the from-scratch MoEs'); an upcycled MoE draws from its own stream so that
        its D2 tokens are fresh samples rather than a replay of the batches its dense parent saw."""
        key = [seed, step] if stream == 0 else [seed, step, stream + 1]  # +1: apart from calibration's [seed, 0, 1]
        return self._windows(np.random.default_rng(key), batch_size, context + 1)

    def _windows(self, rng: np.random.Generator, n: int, length: int) -> torch.Tensor:
        starts = rng.integers(0, len(self.train) - length, size=n)
        idx = starts[:, None] + np.arange(length)[None, :]
        return torch.from_numpy(self.train[idx].astype(np.int64))

    def val_batches(self, eval_tokens: int, context: int, batch_size: int) -> list[torch.Tensor]:
        """The fixed held-out set: consecutive windows covering the first `eval_tokens` predicted tokens."""
        n = max(1, eval_tokens // context)
        if len(self.val) < n * context + 1:
            raise WorkerError(f"validation set has {len(self.val)} tokens; {n * context + 1} needed")
        idx = np.arange(n)[:, None] * context + np.arange(context + 1)[None, :]
        windows = torch.from_numpy(self.val[idx].astype(np.int64))
        return list(windows.split(batch_size))

    def calibration(self, seed: int, n_tokens: int, context: int) -> torch.Tensor:
        """[n, context] training windows for upcycling methods that need activations (a stream apart from batches)."""
        return self._windows(np.random.default_rng([seed, 0, 1]), max(1, n_tokens // context), context)


def load_tokens(data: DataSpec, context: int, cache_dir: Path | None = None,
                progress: Callable[[int, int], None] | None = None,
                data_roots: Sequence[str] | None = None) -> TokenData:
    """Tokenise the corpus once (cached by data fingerprint + tokeniser + split) and memory-map the arrays.

    A user corpus or a Hugging Face tokenizer is keyed by its content fingerprint: the planner's
    (`DataSpec.fingerprint`), computed here when ``data`` has none. ``progress(documents encoded, documents)`` is told
    only when the cache is built: (0, 0) first (a BPE tokeniser may be trained then), then after every chunk of
    documents encoded (documents is 0 while the corpus's length is not known), and (n, n) at the end. With
    ``data_roots`` (a server's sweep), a corpus or tokenizer file outside them is refused before it is read, as the
    server refused it at submit: the files may have changed since."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if data_roots is not None:
        _content_fingerprint(data, cache_dir, [Path(r) for r in data_roots])
    content = data.fingerprint
    if content is None:
        content = _content_fingerprint(data, cache_dir)
    if content is None:  # the builtin corpus with bytes or bpe: the key it always had
        key_fingerprint, tokenizer_key = corpus_fingerprint(data), data.tokenizer
    else:  # the content stands for the paths: the same files anywhere share one cache
        key_fingerprint = f"{content}|{data.text_column}"
        tokenizer_key = data.tokenizer if data.tokenizer in ("bytes", "bpe") else "hf"
    key_src = json.dumps([CACHE_VERSION, key_fingerprint, tokenizer_key,
                          data.bpe_vocab_size if data.tokenizer == "bpe" else 0, data.eval_tokens, data.data_seed])
    out = cache_dir / hashlib.sha256(key_src.encode()).hexdigest()[:16]
    if not (out / "meta.json").exists():  # the tokeniser is needed (and a BPE trained) only to build the cache
        if data.fingerprint is not None and _content_fingerprint(data, cache_dir) != data.fingerprint:
            raise WorkerError(f"the data changed since the sweep was planned (corpus {data.corpus!r}, tokenizer "
                              f"{data.tokenizer!r}): its segments are keyed by the old content; submit the sweep "
                              f"again to plan it on the data as it is now")
        if progress:
            progress(0, 0)
        tok = get_tokenizer(data, cache_dir, key_fingerprint if content is None else content)
        _build_cache(data, tok, out, key_src, progress)
    meta = json.loads((out / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    train = np.memmap(out / "train.bin", dtype=dtype, mode="r")
    val = np.memmap(out / "val.bin", dtype=dtype, mode="r")
    if len(train) < context + 2:
        raise WorkerError(f"corpus {data.corpus!r} has only {len(train)} training tokens; need > context+1 = "
                          f"{context + 1}")
    return TokenData(train=train, val=val, vocab_size=meta["vocab_size"], cache_dir=out)


def _chunks(docs: Iterator[str], size: int) -> Iterator[list[str]]:
    while chunk := list(islice(docs, size)):
        yield chunk


def _build_cache(data: DataSpec, tok: Tokenizer, out: Path, key_src: str,
                 progress: Callable[[int, int], None] | None) -> None:
    """Encode the corpus a chunk at a time into one token file (memory holds a chunk and the documents' lengths,
    not the corpus), then split it by document into val.bin and train.bin."""
    total = _document_count(data)
    dtype = np.uint8 if tok.vocab_size <= 256 else np.uint16 if tok.vocab_size <= 65536 else np.uint32
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
    try:
        lengths: list[int] = []
        with open(tmp / "all.bin", "wb") as fh:
            for chunk in _chunks(iter_documents(data), ENCODE_CHUNK):
                for ids in tok.encode(chunk):
                    ids.astype(dtype).tofile(fh)
                    lengths.append(len(ids))
                if progress:
                    progress(len(lengths), max(total, len(lengths)) if total else 0)
        if not lengths:
            raise WorkerError(f"corpus {data.corpus!r} contains no text")
        if progress:
            progress(len(lengths), len(lengths))
        val_ids = _validation_documents(data, lengths)
        starts = np.concatenate([[0], np.cumsum(lengths)])
        tokens = np.memmap(tmp / "all.bin", dtype=dtype, mode="r") if starts[-1] else np.zeros(0, dtype)
        with open(tmp / "val.bin", "wb") as fh:
            for i in val_ids:
                tokens[starts[i]:starts[i + 1]].tofile(fh)
        with open(tmp / "train.bin", "wb") as fh:  # every other document, in corpus order: the runs between val ones
            begin = 0
            for i in [*sorted(val_ids), len(lengths)]:
                tokens[starts[begin]:starts[i]].tofile(fh)
                begin = i + 1
        del tokens
        (tmp / "all.bin").unlink()
        meta = {"key": key_src, "vocab_size": tok.vocab_size, "dtype": np.dtype(dtype).name,
                "documents": len(lengths), "val_documents": len(val_ids)}
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            tmp.rename(out)
        except OSError:  # another job finished the same cache first
            if not (out / "meta.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _validation_documents(data: DataSpec, lengths: list[int]) -> list[int]:
    """Whole documents, in the `data_seed` shuffle's order, until they hold eval_tokens + 1 tokens."""
    order = np.random.default_rng([data.data_seed, 1]).permutation(len(lengths))
    val_ids, n_val = [], 0
    for i in order:
        if n_val > data.eval_tokens:
            break
        val_ids.append(int(i))
        n_val += lengths[i]
    if len(val_ids) == len(lengths):
        raise WorkerError(f"corpus {data.corpus!r} is too small: validation (eval_tokens={data.eval_tokens}) "
                          f"would take every document; lower data.eval_tokens or add text")
    return val_ids
