"""upscale.storage on real filesystems: the local disk (plain paths and file:// URIs) and fsspec's in-memory one
(memory://, a non-local protocol). No training here: checkpoint folders are made of small files; the segment-level
behaviour (train, push, resume, fetch a parent) is tests/workers/test_segment_uris.py.

Strategy: push a folder and read it back file by file; record the order in which a real filesystem receives the
files (a MemoryFileSystem subclass under its own protocol that notes each upload) to check the sidecar comes last;
break downloads and pushes half way to check nothing incomplete ever looks complete."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from upscale import storage
from upscale.storage import StorageError


class RecordingMemoryFS(MemoryFileSystem):
    """The in-memory filesystem under its own protocol and store, noting every upload and deletion in order, and
    losing its link when asked to download a file named in `fail_get`."""

    protocol = "recmem"
    store: dict = {}  # noqa: RUF012 (MemoryFileSystem keeps its files in class attributes)
    pseudo_dirs = [""]  # noqa: RUF012
    log: list[tuple[str, str]] = []  # noqa: RUF012
    fail_get: set[str] = set()  # noqa: RUF012

    def put_file(self, lpath, rpath, *args, **kwargs):
        type(self).log.append(("put", rpath.rsplit("/", 1)[-1]))
        return super().put_file(lpath, rpath, *args, **kwargs)

    def rm_file(self, path):
        type(self).log.append(("rm", path.rsplit("/", 1)[-1]))
        return super().rm_file(path)

    def get_file(self, rpath, lpath, *args, **kwargs):
        if rpath.rsplit("/", 1)[-1] in type(self).fail_get:
            raise ConnectionError("link lost")
        return super().get_file(rpath, lpath, *args, **kwargs)


fsspec.register_implementation("recmem", RecordingMemoryFS, clobber=True)


def make_checkpoint(folder: Path, segment_id: str, tokens: int) -> Path:
    """A folder shaped like workers.checkpoints.save's: engine files, a model/ export, the sidecar."""
    (folder / "model").mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(b"engine" * 100)
    (folder / "model" / "config.json").write_text("{}")
    (folder / "model" / "weights.pt").write_bytes(b"w" * 1000)
    (folder / storage.META_FILE).write_text(json.dumps({"segment_id": segment_id, "tokens": tokens}))
    return folder


def files(fs, path: str) -> dict[str, bytes]:
    return {f[len(path.rstrip("/")) + 1:]: fs.cat_file(f) for f in fs.find(path)}


def local_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def mem() -> str:
    """A fresh memory:// root (the in-memory filesystem is process-wide)."""
    fs = fsspec.filesystem("memory")
    if fs.exists("/t"):
        fs.rm("/t", recursive=True)
    return "memory://t"


def test_paths_and_uris_are_told_apart_and_joined() -> None:
    assert storage.is_uri("s3://bucket/x") and storage.is_uri("file:///abs") and storage.is_uri("memory://a")
    assert storage.is_uri("simplecache::s3://bucket/x")
    assert not storage.is_uri("/abs/path") and not storage.is_uri("rel/path") and not storage.is_uri(Path("/a"))
    assert storage.join("s3://bucket/ckpt/", "abc", "tokens_1") == "s3://bucket/ckpt/abc/tokens_1"  # not s3:/bucket
    assert storage.join("/root/ckpt", "abc") == "/root/ckpt/abc"
    root = Path("/stage")
    assert storage.mirror("file:///data/ck/abc", root) == root / "file" / "data" / "ck" / "abc"
    assert storage.mirror("memory://b/ck/abc", root) == root / "memory" / "b" / "ck" / "abc"
    assert storage.staging_root("/home/u/.upscale/data") == Path("/home/u/.upscale/staging")


def test_a_location_nothing_can_open_is_a_clear_error() -> None:
    with pytest.raises(StorageError, match=r"'nosuch://x': Protocol not known: nosuch\. Use a local path or a URI"):
        storage.check("nosuch://x")
    storage.check("/any/local/path")  # never refused
    storage.check("memory://fine")
    if importlib.util.find_spec("gcsfs") is None:
        with pytest.raises(StorageError, match=r"gcsfs.*Install the protocol's fsspec package.*gcsfs for gs://"):
            storage.check("gs://bucket/upscale")


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_push_uploads_every_file_and_complete_lists_it(kind: str, mem: str, tmp_path: Path) -> None:
    root = mem if kind == "memory" else f"file://{tmp_path / 'remote'}"
    ck = make_checkpoint(tmp_path / "local" / "tokens_000000000000512", "seg", 512)
    make_checkpoint(tmp_path / "local" / "tokens_000000000001024", "other-seg", 1024)
    storage.push(ck, storage.join(root, ck.name))
    storage.push(tmp_path / "local" / "tokens_000000000001024", storage.join(root, "tokens_000000000001024"))
    fs, path = storage.filesystem(storage.join(root, ck.name))
    assert files(fs, path) == local_files(ck)
    assert storage.complete(root, "seg") == {512: f"{root}/tokens_000000000000512"}  # spelled as the root is
    assert storage.complete(root, "nobody") == {} and storage.complete(f"{root}/missing", "seg") == {}
    assert storage.size(storage.join(root, ck.name)) == sum(len(b) for b in local_files(ck).values())
    storage.remove(storage.join(root, ck.name))
    assert not storage.exists(storage.join(root, ck.name)) and storage.complete(root, "seg") == {}
    storage.remove(storage.join(root, ck.name))  # already gone: fine
    assert storage.size(storage.join(root, ck.name)) == 0


def test_the_sidecar_is_uploaded_last_and_an_old_one_removed_first(tmp_path: Path) -> None:
    ck = make_checkpoint(tmp_path / "tokens_000000000000256", "seg", 256)
    RecordingMemoryFS.log.clear()
    storage.push(ck, "recmem://r/seg/tokens_000000000000256")
    assert RecordingMemoryFS.log[-1] == ("put", storage.META_FILE) and len(RecordingMemoryFS.log) == 4
    assert storage.complete("recmem://r/seg", "seg") == {256: "recmem://r/seg/tokens_000000000000256"}
    # the same tag pushed again (a checkpoint saved anew): its old sidecar goes before anything is overwritten
    RecordingMemoryFS.log.clear()
    storage.push(ck, "recmem://r/seg/tokens_000000000000256")
    assert RecordingMemoryFS.log[0] == ("rm", storage.META_FILE) and RecordingMemoryFS.log[-1][1] == storage.META_FILE
    assert [op for op, name in RecordingMemoryFS.log if name == storage.META_FILE] == ["rm", "put"]
    (ck / storage.META_FILE).unlink()
    with pytest.raises(StorageError, match="not a complete checkpoint"):  # an interrupted save is never published
        storage.push(ck, "recmem://r/seg/tokens_000000000000512")


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_fetch_downloads_once_and_drops_a_stale_copy(kind: str, mem: str, tmp_path: Path) -> None:
    root = mem if kind == "memory" else f"file://{tmp_path / 'remote'}"
    ck = make_checkpoint(tmp_path / "local" / "tokens_000000000000512", "seg", 512)
    uri = storage.join(root, "trunk", ck.name)
    storage.push(ck, uri)
    staging = tmp_path / "staging"
    got = storage.fetch(uri, staging)
    assert got == storage.mirror(uri, staging) and local_files(got) == local_files(ck)
    assert not [p for p in got.parent.iterdir() if p.name.startswith(f".{ck.name}.") and p.is_dir()]  # no temp left
    # a complete local copy is reused: a file changed at the URI is not downloaded again
    fs, path = storage.filesystem(uri)
    fs.pipe_file(f"{path}/model/weights.pt", b"changed")
    assert storage.fetch(uri, staging) == got and (got / "model" / "weights.pt").read_bytes() == b"w" * 1000
    # a copy without its sidecar (a download cut short) is not complete: fetched again, whole
    (got / storage.META_FILE).unlink()
    assert (storage.fetch(uri, staging) / "model" / "weights.pt").read_bytes() == b"changed"
    assert (got / storage.META_FILE).is_file()
    # the checkpoint deleted at the URI (garbage collection): the local copy no longer stands for it
    storage.remove(uri)
    assert not (storage.fetch(uri, staging) / storage.META_FILE).exists()
    assert storage.fetch("/plain/path", staging) == Path("/plain/path")  # a path passes through untouched


def test_a_download_cut_short_leaves_nothing_that_looks_complete(tmp_path: Path) -> None:
    ck = make_checkpoint(tmp_path / "tokens_000000000000512", "seg", 512)
    uri = "recmem://cut/x/tokens_000000000000512"
    storage.push(ck, uri)
    staging = tmp_path / "staging"
    RecordingMemoryFS.fail_get = {storage.META_FILE}  # the link drops once the body is down, before the sidecar
    try:
        with pytest.raises(ConnectionError):
            storage.fetch(uri, staging)
    finally:
        RecordingMemoryFS.fail_get = set()
    local = storage.mirror(uri, staging)
    assert not local.exists() and [p.name for p in local.parent.iterdir()] == [f".{ck.name}.lock"]  # no half copy
    assert local_files(storage.fetch(uri, staging)) == local_files(ck)


@pytest.mark.parametrize("kind", ["memory", "path"])
def test_small_files_are_written_whole_read_and_deleted(kind: str, mem: str, tmp_path: Path) -> None:
    d = storage.join(mem, "seg") if kind == "memory" else str(tmp_path / "seg")
    assert storage.read_text(d, "result.json") is None
    storage.write_text(d, "result.json", '{"a": 1}')
    storage.write_text(d, "result.json", '{"a": 2}')
    assert storage.read_text(d, "result.json") == '{"a": 2}'
    fs, path = storage.filesystem(d)
    assert [f.rsplit("/", 1)[-1] for f in fs.find(path)] == ["result.json"]  # no temporary file left
    storage.delete(d, "result.json")
    storage.delete(d, "result.json")
    assert storage.read_text(d, "result.json") is None


def test_pull_keeps_only_what_the_uri_holds_and_fetches_the_newest(mem: str, tmp_path: Path) -> None:
    folder = storage.SegmentFolder.open(storage.join(mem, "seg"), str(tmp_path / "cache"))
    assert folder.remote and folder.local == tmp_path / "staging" / "memory" / "t" / "seg"
    for tokens in (256, 512):
        folder.push(make_checkpoint(folder.local / f"tokens_{tokens:015d}", "seg", tokens))
    unpushed = make_checkpoint(folder.local / f"tokens_{768:015d}", "seg", 768)  # saved, node lost before the push
    half = folder.local / f"tokens_{1024:015d}"
    half.mkdir()  # an interrupted save
    shutil.rmtree(folder.local / f"tokens_{512:015d}")  # another node: the newest is only at the URI
    assert folder.pull("seg") == folder.local
    assert sorted(p.name for p in folder.local.glob("tokens_*")) == [f"tokens_{t:015d}" for t in (256, 512)]
    assert not unpushed.exists() and (folder.local / f"tokens_{512:015d}" / storage.META_FILE).is_file()
    assert folder.complete("seg") == {t: f"{mem}/seg/tokens_{t:015d}" for t in (256, 512)}
    folder.remove(folder.local / f"tokens_{256:015d}")
    assert folder.complete("seg") == {512: f"{mem}/seg/tokens_{512:015d}"}
    assert not (folder.local / f"tokens_{256:015d}").exists()
    folder.discard()
    assert not folder.local.exists() and not storage.exists(folder.location)
    plain = storage.SegmentFolder.open(str(tmp_path / "plain"))
    assert not plain.remote and plain.local == tmp_path / "plain" and plain.pull("seg") == plain.local
