"""Where a sweep's tokens come from, read without torch, `datasets` or `transformers`: the files a corpus is made of,
the vocabulary of a tokenizer, and the content fingerprint that puts the data into segment identity.

The planner calls `resolve_data` once per plan: a user corpus or a Hugging Face tokenizer gets `DataSpec.fingerprint`,
a hash of the bytes of its files (not of their paths), so the same files anywhere give the same segment keys and
changed files new ones. Each file's hash is remembered by (path, size, mtime) under the data cache, so planning again
reads nothing. The workers (workers/data.py) read the corpus through `corpus_source`, the one place its layout is
decided. Nothing here downloads: a hub id or URL is refused with a message saying to download it first.

A server passes its data roots (`roots`): then every entry a corpus walk or glob yields (a symlinked file, a dangling
symlink, a symlinked folder) and every tokenizer file is resolved and refused unless it lies under a root, with
`upscale.data_roots`' one message whatever the entry points at, so that neither the outside file is read nor its
existence told. Without roots (the operator's own CLI) nothing is confined.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sysconfig
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from upscale.data_roots import OutsideRoots, confine
from upscale.home import upscale_home
from upscale.sweeps.errors import SpecError
from upscale.sweeps.segments import BUILTIN_CORPORA, BUILTIN_STDLIB, DataSpec

BYTE_VOCAB = 256
BUILTIN_TOKENIZERS = frozenset({"bytes", "bpe"})
# File formats `datasets.load_dataset` reads, by suffix, and the builder that reads each.
DATASET_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".txt": "text", ".csv": "csv",
                    ".arrow": "arrow"}
# The files a Hugging Face tokenizer folder may hold: a tokenizer folder is often a model's folder, so only these are
# hashed (never its weights), and copied when a model is imported or exported (workers/hf_models.py).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "spiece.model", "vocab.json", "merges.txt", "vocab.txt", "chat_template.jinja")
FINGERPRINT_VERSION = 1  # bump when how a corpus is read into documents changes: new keys, new token caches
HASH_BLOCK = 1 << 20
# What reading a corpus's file list may cost: at most this many files, found within this many seconds of walking (a
# glob holds at most one `**`, `DataSpec`'s rule, refused before any walk).
MAX_CORPUS_FILES = 100_000
MAX_WALK_S = 10.0
SourceKind = Literal["text_files", "saved_dataset", "data_files"]


def default_cache_dir() -> Path:
    """Settings.data_cache_dir of the default settings: <home>/cache/data, apart from the data roots (<home>/data)."""
    return upscale_home() / "cache" / "data"


@dataclass(frozen=True)
class CorpusSource:
    """A corpus's files and how they are read: `text_files` (every file one document: a folder, the builtin),
    `saved_dataset` (a `save_to_disk` folder, `datasets.load_from_disk`), or `data_files` (files or a glob read by
    `datasets.load_dataset(builder)`). `base` is what file names are taken relative to in the fingerprint."""

    kind: SourceKind
    base: Path
    files: tuple[Path, ...]
    builder: str | None = None


def _problem(field: str, message: str) -> SpecError:
    return SpecError([(field, message)])


def is_glob(corpus: str) -> bool:
    return glob.has_magic(corpus)


def bounded_files(found: Iterable[str | Path], corpus: str, roots: Sequence[Path] | None = None) -> list[Path]:
    """The files of ``found`` (paths as a glob or a folder walk yields them, lazily), sorted; SpecError once more than
    MAX_CORPUS_FILES are found or the walk has taken MAX_WALK_S, so no corpus costs a server more than that. With
    ``roots``, every entry found, before it is looked at, must resolve under one (`confine_entry`)."""
    deadline = time.monotonic() + MAX_WALK_S
    files = []
    for i, p in enumerate(found):
        if i % 256 == 0 and time.monotonic() > deadline:
            raise _problem("data.corpus", f"corpus {corpus!r}: listing its files took over {MAX_WALK_S:g} s; name "
                                          "a narrower folder or glob")
        if roots is not None:
            confine_entry("data.corpus", p, roots)
        if os.path.isfile(p):
            files.append(Path(p))
            if len(files) > MAX_CORPUS_FILES:
                raise _problem("data.corpus", f"corpus {corpus!r} has over {MAX_CORPUS_FILES:,} files; merge them "
                                              "into fewer (parquet or jsonl shards) or name a narrower glob")
    return sorted(files)


def confine_entry(field: str, path: str | Path, roots: Sequence[Path], instead: str | None = "a builtin: name") -> None:
    """SpecError at ``field`` unless ``path``, resolved, lies under one of ``roots``: the message is
    `upscale.data_roots.confine`'s, the same for a dangling symlink as for one to an existing file."""
    try:
        confine(str(path), roots, instead=instead)
    except OutsideRoots as e:
        raise _problem(field, str(e)) from None


def check_present(field: str, path: str, roots: Sequence[Path]) -> None:
    """SpecError at ``field`` when ``path`` lies under one of ``roots`` and is not there. The roots are folders of
    this machine, so what is missing under them is missing (elsewhere an absent absolute path may be on the machines
    that train: `_absent`); of a path outside them nothing is said, as `confine` says nothing of a path's state."""
    try:
        confine(path, roots, instead=None)
    except OutsideRoots:
        return
    if _absent(path):
        raise _problem(field, f"{path!r} does not exist under the data roots; give a folder, file or glob that does")


def corpus_glob(corpus: str, roots: Sequence[Path] | None = None) -> list[Path]:
    """The files a corpus glob matches, within `bounded_files`' limits (and ``roots``)."""
    return bounded_files(glob.iglob(os.path.expanduser(corpus), recursive=True), corpus, roots)


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts[:-1]))


def is_saved_dataset(path: Path) -> bool:
    """A folder written by `datasets`' `save_to_disk`: a Dataset (its info and state) or a DatasetDict, as
    `datasets.load_from_disk` tells them."""
    return ((path / "dataset_info.json").is_file() and (path / "state.json").is_file()) \
        or (path / "dataset_dict.json").is_file()


def _not_local(field: str, name: str, what: str, why: str = "is not a local path") -> SpecError:
    return _problem(field, f"{what} {name!r} {why}; nothing is downloaded from a hub: download it "
                           f"first (for a dataset, `datasets.load_dataset(...).save_to_disk(DIR)`; for a tokenizer, "
                           f"`save_pretrained(DIR)`) and give the folder's absolute path")


def _absent(name: str) -> bool:
    """An absolute path (or a glob below an absolute folder) that is not on this machine: it may be on the machines
    that train (a cluster's shared volume), so planning goes on without a fingerprint and the worker reads it."""
    expanded = os.path.expanduser(name)
    if not os.path.isabs(expanded):
        return False
    if is_glob(expanded):
        return not _glob_base(Path(expanded)).exists()
    return not os.path.exists(expanded)


def _glob_base(pattern: Path) -> Path:
    """The folder a glob is rooted at: its leading parts without wildcards."""
    parts = []
    for part in pattern.parts:
        if glob.has_magic(part):
            break
        parts.append(part)
    return Path(*parts) if parts else Path(".")


def _builder_of(files: list[Path], corpus: str) -> str:
    builders = {DATASET_BUILDERS.get(f.suffix) for f in files}
    if None in builders:
        odd = sorted({f.suffix or f.name for f in files if f.suffix not in DATASET_BUILDERS})
        raise _problem("data.corpus", f"corpus {corpus!r}: cannot read {', '.join(odd)} files; give .parquet, "
                                      f".jsonl, .json, .txt, .csv or .arrow files, a save_to_disk folder, or a folder "
                                      f"of text files")
    if len(builders) > 1:
        raise _problem("data.corpus", f"corpus {corpus!r} mixes formats ({', '.join(sorted(builders))}); give one "
                                      f"format per corpus")
    return builders.pop()


def corpus_source(corpus: str, roots: Sequence[Path] | None = None) -> CorpusSource:
    """The files of ``corpus`` and how they are read; SpecError (at data.corpus) for a hub id or URL, a missing
    path, a glob matching nothing, an unreadable format or an empty corpus, and, with ``roots``, for the corpus or
    any entry of its walk outside them (checked before the entry is looked at)."""
    if corpus == BUILTIN_STDLIB:
        return CorpusSource("text_files", Path(sysconfig.get_paths()["stdlib"]), tuple(_stdlib_files()))
    if corpus.startswith("builtin:"):
        known = ", ".join(sorted(BUILTIN_CORPORA))
        raise _problem("data.corpus", f"unknown builtin corpus {corpus!r}; builtins: {known}")
    if "://" in corpus:
        raise _not_local("data.corpus", corpus, "corpus")
    if roots is not None:
        confine_entry("data.corpus", corpus, roots)
    path = Path(corpus).expanduser()
    if is_glob(corpus):
        files = corpus_glob(corpus, roots)
        if not files:
            raise _problem("data.corpus", f"corpus glob {corpus!r} matches no file")
        source = CorpusSource("data_files", _glob_base(path), tuple(files), _builder_of(files, corpus))
    elif not path.exists():
        if not path.is_absolute():
            raise _not_local("data.corpus", corpus, "corpus", f"does not exist (a relative path, from {Path.cwd()})")
        raise _problem("data.corpus", f"corpus path {corpus!r} does not exist; give a folder of text files, a "
                                      f".parquet/.jsonl/.json/.txt file or glob, a save_to_disk dataset folder, or "
                                      f"{BUILTIN_STDLIB}")
    elif path.is_file():
        source = CorpusSource("data_files", path.parent, (path,), _builder_of([path], corpus))
    elif is_saved_dataset(path):
        source = CorpusSource("saved_dataset", path, tuple(bounded_files(path.rglob("*"), corpus, roots)))
    else:
        files = bounded_files((p for p in path.rglob("*") if not p.name.startswith(".")), corpus, roots)
        source = CorpusSource("text_files", path, tuple(files))
    if not source.files or all(f.stat().st_size == 0 for f in source.files):
        raise _problem("data.corpus", f"corpus {corpus!r} is empty: no non-empty files found")
    return source


# -- tokenizers -------------------------------------------------------------------------------------------


def tokenizer_path(data: DataSpec, roots: Sequence[Path] | None = None) -> Path | None:
    """The Hugging Face tokenizer `data.tokenizer` names (a folder or a tokenizer.json), None for bytes and bpe;
    SpecError (at data.tokenizer) for a hub id, a missing path, or a folder without a tokenizer, and, with ``roots``,
    for a path or tokenizer file outside them."""
    if data.tokenizer in BUILTIN_TOKENIZERS:
        return None
    if roots is not None:
        confine_entry("data.tokenizer", data.tokenizer, roots, instead="bytes, bpe")
    path = Path(data.tokenizer).expanduser()
    if "://" in data.tokenizer or not path.exists():
        if not path.is_absolute():  # a typo of bytes/bpe reads as a relative path, so both are named
            raise _problem("data.tokenizer", f"tokenizer {data.tokenizer!r} is neither bytes, bpe nor a local path; "
                                             f"nothing is downloaded from a hub: save the tokenizer with "
                                             f"save_pretrained(DIR) first and give the folder's absolute path")
        raise _problem("data.tokenizer", f"tokenizer {data.tokenizer!r} does not exist; give bytes, bpe, a Hugging "
                                         f"Face tokenizer folder or a tokenizer.json file")
    if path.is_dir() and not tokenizer_files(path, roots):
        raise _problem("data.tokenizer", f"tokenizer folder {data.tokenizer!r} holds no tokenizer (none of "
                                         f"{', '.join(TOKENIZER_FILES[:2])}, ...); save one with save_pretrained")
    return path


def tokenizer_files(path: Path, roots: Sequence[Path] | None = None) -> list[Path]:
    """The files that define the tokenizer at ``path`` (a tokenizer.json file, or the tokenizer files of a folder);
    with ``roots``, SpecError (at data.tokenizer) if any of those names in the folder, a dangling symlink included,
    resolves outside them."""
    if roots is not None:
        for name in TOKENIZER_FILES:
            if os.path.lexists(path / name):
                confine_entry("data.tokenizer", path / name, roots, instead="bytes, bpe")
    if path.is_file():
        return [path]
    return [path / name for name in TOKENIZER_FILES if (path / name).is_file()]


def vocab_size_of(data: DataSpec) -> int:
    """The model's vocabulary for ``data``'s tokenizer: 256 for bytes, bpe_vocab_size for bpe, else one more than
    the largest token id of the Hugging Face tokenizer (its added tokens included), read from tokenizer.json."""
    if data.tokenizer == "bytes":
        return BYTE_VOCAB
    if data.tokenizer == "bpe":
        return data.bpe_vocab_size
    path = tokenizer_path(data)
    assert path is not None
    file = path if path.is_file() else path / "tokenizer.json"
    if file.is_file():
        return _tokenizer_json_vocab(file)
    return _auto_tokenizer_vocab(path)


def _tokenizer_json_vocab(file: Path) -> int:
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
        vocab = doc["model"]["vocab"]
        ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))  # Unigram: a list
        ids += [t["id"] for t in doc.get("added_tokens") or []]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _problem("data.tokenizer", f"{file} is not a tokenizers tokenizer.json ({type(e).__name__}: "
                                         f"{e}); save it with tokenizers' Tokenizer.save or save_pretrained") from None
    if not ids:
        raise _problem("data.tokenizer", f"{file} has an empty vocabulary (model.vocab)")
    return max(ids) + 1


def _auto_tokenizer_vocab(folder: Path) -> int:
    """A folder without tokenizer.json (a sentencepiece model, say): what transformers' AutoTokenizer loads from it."""
    try:
        from transformers import AutoTokenizer

        return len(AutoTokenizer.from_pretrained(str(folder), local_files_only=True))
    except Exception as e:  # (transformers raises many kinds for an unloadable folder)
        raise _problem("data.tokenizer", f"tokenizer folder {str(folder)!r} has no tokenizer.json and "
                                         f"AutoTokenizer cannot load it ({type(e).__name__})") from None


# -- fingerprints -----------------------------------------------------------------------------------------


def resolve_data(data: DataSpec, cache_dir: Path | None = None, roots: Sequence[Path] | None = None) -> DataSpec:
    """``data`` with `fingerprint` set to the content hash of its user corpus and Hugging Face tokenizer files; the
    builtin corpus with bytes/bpe keeps None, as does data not on this machine (an absolute path absent here, which
    the workers read where it is). ``cache_dir`` keeps the per-file hashes (default: the default data cache); with
    ``roots``, no file outside them is read (`corpus_source`, `tokenizer_files`)."""
    user_corpus = data.corpus not in BUILTIN_CORPORA
    user_tokenizer = data.tokenizer not in BUILTIN_TOKENIZERS
    if not (user_corpus or user_tokenizer):
        return data if data.fingerprint is None else data.model_copy(update={"fingerprint": None})
    if (user_corpus and _absent(data.corpus)) or (user_tokenizer and _absent(data.tokenizer)):
        return data.model_copy(update={"fingerprint": None})
    memo = FileHashes((cache_dir or default_cache_dir()) / "fingerprints")
    h = hashlib.sha256(f"upscale-data v{FINGERPRINT_VERSION}\n".encode())
    if user_corpus:
        source = corpus_source(data.corpus, roots)
        h.update(f"corpus {source.kind} {source.builder}\n".encode())
        for f in source.files:
            h.update(f"{f.relative_to(source.base).as_posix()}\t{memo.sha256(f)}\n".encode())
    path = tokenizer_path(data, roots)
    if path is not None:
        h.update(b"tokenizer\n")
        for f in tokenizer_files(path, roots):
            h.update(f"{f.name}\t{memo.sha256(f)}\n".encode())
    return data.model_copy(update={"fingerprint": h.hexdigest()[:32]})


class FileHashes:
    """sha256 of files, remembered by (resolved path, size, mtime) in one small JSON file per path under ``folder``;
    a write that races another leaves one whole file (written aside and renamed)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def sha256(self, file: Path) -> str:
        real = os.path.realpath(file)
        st = os.stat(real)
        stamp = {"path": real, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        entry = self.folder / f"{hashlib.sha256(real.encode()).hexdigest()[:32]}.json"
        try:
            known = json.loads(entry.read_text())
            if {k: known.get(k) for k in stamp} == stamp:
                return known["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
        digest = hashlib.sha256()
        with open(real, "rb") as fh:
            while block := fh.read(HASH_BLOCK):
                digest.update(block)
        stamp["sha256"] = digest.hexdigest()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = entry.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(stamp))
            tmp.replace(entry)
        except OSError:  # a read-only cache only costs the next plan a re-read
            pass
        return stamp["sha256"]
