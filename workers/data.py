"""Corpus -> documents -> tokens in a memory-mapped cache -> batches that are a pure function of (seed, step).

Sources (`DataSpec.corpus`): `builtin:python-stdlib` (the running Python's standard-library .py files, tests and
site-packages excluded: ~11 MB of real text on every machine, no download), a folder of text files (read
recursively), a `.jsonl` or `.parquet` file with a text column, or a Hugging Face dataset saved with `save_to_disk`
(its `*.arrow` shards, every split of a DatasetDict, are read with pyarrow: the `datasets` package is not needed).

Tokens are computed once per (corpus fingerprint, tokeniser) and stored as uint8/16/32 arrays under
`<cache>/<key>/{train,val}.bin`, written to a temporary folder and renamed, so concurrent jobs never read a half
cache. Documents are shuffled with `data_seed` and the first ones, up to `eval_tokens + 1` tokens, form the
validation set: validation text never appears in training. A training batch draws random windows from the train
array with a generator seeded by (data_seed, step): a resumed run, or a decay branch, sees exactly the batches
an uninterrupted run would have seen.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from upscale.home import upscale_home
from upscale.sweeps.segments import BUILTIN_STDLIB, DataSpec
from upscale.workers.errors import WorkerError

CACHE_VERSION = 1
BYTE_VOCAB = 256
ENCODE_CHUNK = 512  # documents per encode call: the grain of load_tokens' progress


def default_cache_dir() -> Path:
    """Settings.data_cache_dir of the default settings: <home>/cache/data, apart from the data roots (<home>/data)."""
    return upscale_home() / "cache" / "data"


# -- sources ----------------------------------------------------------------------------------------------


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts[:-1]))


def _is_hf_dataset(path: Path) -> bool:
    """A folder written by `datasets`' `save_to_disk` (a Dataset or a DatasetDict)."""
    return any((path / f).is_file() for f in ("state.json", "dataset_info.json", "dataset_dict.json"))


def _source_files(corpus: str) -> list[Path]:
    """The files that make up a corpus (their stat is the cheap fingerprint of the cache key)."""
    if corpus == BUILTIN_STDLIB:
        return _stdlib_files()
    path = Path(corpus).expanduser()
    if not path.exists():
        raise WorkerError(f"corpus path {corpus!r} does not exist; give a folder of text files, a .jsonl/.parquet "
                          f"file, a save_to_disk dataset folder, or {BUILTIN_STDLIB}")
    if path.is_file():
        if path.suffix not in (".jsonl", ".parquet"):
            raise WorkerError(f"corpus file {corpus!r} must end in .jsonl or .parquet")
        files = [path]
    elif _is_hf_dataset(path):
        files = sorted(path.rglob("*.arrow"))  # a DatasetDict: every split's shards
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not files or all(f.stat().st_size == 0 for f in files):
        raise WorkerError(f"corpus {corpus!r} is empty: no non-empty files found")
    return files


def _text_column(table, column: str, where: Path) -> list[str]:  # table: pyarrow.Table
    if column not in table.column_names:
        raise WorkerError(f"{where} has no column {column!r}; columns: {table.column_names}; set data.text_column")
    return [t for t in table.column(column).to_pylist() if t]


def iter_documents(data: DataSpec) -> Iterator[str]:
    """Every document of the corpus as text, in a fixed order."""
    path = Path(data.corpus).expanduser()
    for f in _source_files(data.corpus):
        if f.suffix == ".jsonl":
            with f.open(encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    row = json.loads(line)
                    if data.text_column not in row:
                        raise WorkerError(f"{f} line {n} has no key {data.text_column!r}; set data.text_column")
                    if row[data.text_column]:
                        yield row[data.text_column]
        elif f.suffix == ".parquet":
            import pyarrow.parquet as pq

            yield from _text_column(pq.read_table(f), data.text_column, f)
        elif f.suffix == ".arrow" and data.corpus != BUILTIN_STDLIB and _is_hf_dataset(path):
            import pyarrow as pa

            with pa.memory_map(str(f)) as src:
                yield from _text_column(pa.ipc.open_stream(src).read_all(), data.text_column, f)
        else:
            text = f.read_text(encoding="utf-8", errors="replace")
            if text:
                yield text


def corpus_fingerprint(data: DataSpec) -> str:
    """Hash of the corpus files' names, sizes and mtimes (and the text column): cheap, changes with the data."""
    h = hashlib.sha256(f"{data.corpus}|{data.text_column}".encode())
    for f in _source_files(data.corpus):
        st = f.stat()
        h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


# -- tokenisers -------------------------------------------------------------------------------------------


class Tokenizer:
    """bytes: UTF-8 bytes as ids 0..255; bpe: a byte-level BPE from the `tokenizers` library."""

    def __init__(self, kind: str, bpe=None) -> None:  # bpe: tokenizers.Tokenizer
        self.kind = kind
        self.bpe = bpe

    @property
    def vocab_size(self) -> int:
        return BYTE_VOCAB if self.bpe is None else self.bpe.get_vocab_size()

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        if self.bpe is None:
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
        return [np.asarray(e.ids, dtype=np.int64) for e in self.bpe.encode_batch(texts)]


def get_tokenizer(data: DataSpec, cache_dir: Path, fingerprint: str) -> Tokenizer:
    """The byte tokeniser, or the BPE trained on this corpus (trained once, cached by the corpus's `fingerprint`
    and the vocabulary size)."""
    if data.tokenizer == "bytes":
        return Tokenizer("bytes")
    from tokenizers import Tokenizer as HFTokenizer
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
                progress: Callable[[int, int], None] | None = None) -> TokenData:
    """Tokenise the corpus once (cached by corpus + tokeniser + split) and memory-map the arrays.

    ``progress(documents encoded, documents)`` is told only when the cache is built: (0, 0) first (a BPE tokeniser may
    be trained then), then after every chunk of documents encoded."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    fingerprint = corpus_fingerprint(data)
    key_src = json.dumps([CACHE_VERSION, fingerprint, data.tokenizer,
                          data.bpe_vocab_size if data.tokenizer == "bpe" else 0, data.eval_tokens, data.data_seed])
    out = cache_dir / hashlib.sha256(key_src.encode()).hexdigest()[:16]
    if not (out / "meta.json").exists():  # the tokeniser is needed (and a BPE trained) only to build the cache
        if progress:
            progress(0, 0)
        _build_cache(data, get_tokenizer(data, cache_dir, fingerprint), out, key_src, progress)
    meta = json.loads((out / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    train = np.memmap(out / "train.bin", dtype=dtype, mode="r")
    val = np.memmap(out / "val.bin", dtype=dtype, mode="r")
    if len(train) < context + 2:
        raise WorkerError(f"corpus {data.corpus!r} has only {len(train)} training tokens; need > context+1 = "
                          f"{context + 1}")
    return TokenData(train=train, val=val, vocab_size=meta["vocab_size"], cache_dir=out)


def _build_cache(data: DataSpec, tok: Tokenizer, out: Path, key_src: str,
                 progress: Callable[[int, int], None] | None) -> None:
    docs = list(iter_documents(data))
    if not docs:
        raise WorkerError(f"corpus {data.corpus!r} contains no text")
    ids: list[np.ndarray] = []
    for start in range(0, len(docs), ENCODE_CHUNK):
        ids += tok.encode(docs[start:start + ENCODE_CHUNK])
        if progress:
            progress(len(ids), len(docs))
    order = np.random.default_rng([data.data_seed, 1]).permutation(len(ids))
    val_ids, n_val = [], 0
    for i in order:  # whole documents into validation until it holds eval_tokens + 1
        if n_val > data.eval_tokens:
            break
        val_ids.append(i)
        n_val += len(ids[i])
    if len(val_ids) == len(ids):
        raise WorkerError(f"corpus {data.corpus!r} is too small: validation (eval_tokens={data.eval_tokens}) "
                          f"would take every document; lower data.eval_tokens or add text")
    val_set = set(val_ids)
    dtype = np.uint8 if tok.vocab_size <= 256 else np.uint16 if tok.vocab_size <= 65536 else np.uint32
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
    try:
        for name, part in (("val", val_ids), ("train", [i for i in range(len(ids)) if i not in val_set])):
            np.concatenate([ids[i] for i in part]).astype(dtype).tofile(tmp / f"{name}.bin")
        meta = {"key": key_src, "vocab_size": tok.vocab_size, "dtype": np.dtype(dtype).name,
                "documents": len(ids), "val_documents": len(val_ids)}
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            tmp.rename(out)
        except OSError:  # another job finished the same cache first
            if not (out / "meta.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
