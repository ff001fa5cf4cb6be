"""Where checkpoints live: a plain local path, or an fsspec URI (`s3://bucket/ckpt`, `gs://…`, `file:///abs`, …).

One job: move checkpoint folders (and the small files beside them) between a location and local disk.

* A *location* is a local path, used as it is (no staging, no copies: the behaviour of local folders), or a URI
  (anything starting with `scheme://`), opened with `fsspec.core.url_to_fs`. The protocol's fsspec package must be
  installed where upscale runs (s3fs for s3://, gcsfs for gs://, adlfs for az://); a missing one or an unknown
  protocol is a `StorageError` saying which.
* DeepSpeed reads and writes local files only, so a segment whose location is a URI trains in a local *mirror* of
  it: `<staging root>/<scheme>/<path of the URI>`, the staging root being `staging/` beside the token cache
  (`<UPSCALE_HOME>/staging` by default). Every checkpoint is *pushed* right after it is saved, `meta.json` last, so
  its presence at the URI marks a complete checkpoint exactly as on a local disk (workers/checkpoints.py); a
  superseded periodic checkpoint is removed there `meta.json` first. When a segment starts (`SegmentFolder.pull`),
  its mirror is reconciled with the URI: local checkpoint folders that the URI does not hold complete (saved but
  never pushed) are dropped, and the newest complete one of the segment is fetched if this node lacks it, so a
  segment whose node was lost resumes on another node from what it had pushed.
* A parent checkpoint given as a URI is *fetched* into its mirror once per node and reused: a decay branch on the
  node that trained its trunk finds the trunk's folder there already. A download lands in a temporary folder
  renamed into place, under a per-folder file lock, so segments running side by side never see half a copy. A local
  copy counts as complete when it holds the folder's marker (`meta.json`, or `config.json` for a bare model folder,
  which `workers.weights.save_model` writes last) and the URI still holds it.
* A segment trained on several processes (workers/parallel.py) shares the mirror among the ranks of a node: `pull`
  and fetches run under a file lock, and after a save each node pushes what its ranks wrote once, then rank 0 pushes
  the sidecar when every node is done (so shards written on other nodes reach the URI before it looks complete).
* The orchestrator uses only the location-level calls (`join`, `write_text`/`read_text`/`delete` for `result.json`
  and `worker.json`, `size` and `remove` for garbage collection), never a mirror. They work on local paths too, so
  its code has one path for both. Small files are written to a temporary name and moved into place, so a reader
  never sees half of one.

The staging root is a cache: deleting it between segments loses nothing that was pushed.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from upscale.home import upscale_home

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

PUSHED = ".pushed"  # left in a local checkpoint folder once this node has uploaded it (several ranks per node)
META_FILE = "meta.json"  # a checkpoint folder's sidecar, written (and pushed) last: its presence marks it complete
TAG_PREFIX = "tokens_"  # checkpoint folders of a segment: tokens_<15 digits>
MARKERS = (META_FILE, "config.json")  # the file written last in a checkpoint folder / a bare model folder
STAGING = "staging"  # the staging root's name, beside the token cache
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(::[A-Za-z][A-Za-z0-9+.\-]*)*://")


class StorageError(ValueError):
    """A checkpoint location nothing here can open, or a folder that is not a checkpoint: a bad value, which
    retrying cannot mend; the message names the location and what to install or fix."""


def is_uri(location: str | Path) -> bool:
    """Whether ``location`` is an fsspec URI (`scheme://…`, chained `a::b://…` included) rather than a local path."""
    return isinstance(location, str) and _URI.match(location) is not None


def join(location: str | Path, *names: str) -> str:
    """``location``/name/…: '/'-joined for a URI (pathlib would turn `s3://b` into `s3:/b`), a path otherwise."""
    if is_uri(location):
        return "/".join([str(location).rstrip("/"), *names])
    return str(Path(location, *names))


def filesystem(location: str | Path) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem of ``location`` and the path in it; a StorageError that says what to install or fix."""
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(str(location))
    except ImportError as e:  # a known protocol whose package is missing: fsspec's message names it
        raise StorageError(f"checkpoint location {str(location)!r}: {e}. Install the protocol's fsspec package "
                          f"wherever upscale runs (the API/scheduler image and every Ray node): s3fs for s3://, "
                          f"gcsfs for gs://, adlfs for az://") from None
    except ValueError as e:
        raise StorageError(f"checkpoint location {str(location)!r}: {e}. Use a local path or a URI of a protocol "
                          f"fsspec knows (s3://, gs://, az://, file://, memory://, ...)") from None
    fs.invalidate_cache(path)  # another node may have changed it since this process listed it (s3fs caches listings)
    return fs, path


def check(location: str) -> None:
    """Raise the StorageError `filesystem` would for a URI nothing here can open; a local path is always fine."""
    if is_uri(location):
        filesystem(location)


def exists(location: str | Path) -> bool:
    fs, path = filesystem(location)
    return fs.exists(path)


# -- small files beside checkpoints (result.json, worker.json) ----------------------------------------------------


def write_text(directory: str | Path, name: str, text: str) -> None:
    """Write ``directory``/``name`` whole: to a temporary name first, then moved into place (a rename on disk)."""
    fs, path = filesystem(directory)
    fs.makedirs(path, exist_ok=True)
    tmp = f"{path}/.{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    fs.pipe_file(tmp, text.encode())
    fs.mv(tmp, f"{path}/{name}")


def read_text(directory: str | Path, name: str) -> str | None:
    """The text of ``directory``/``name``; None when it does not exist."""
    fs, path = filesystem(directory)
    try:
        return fs.cat_file(f"{path}/{name}").decode()
    except FileNotFoundError:
        return None


def delete(directory: str | Path, name: str) -> None:
    """Delete ``directory``/``name`` if it exists."""
    fs, path = filesystem(directory)
    with suppress(FileNotFoundError):
        fs.rm_file(f"{path}/{name}")


# -- whole folders ------------------------------------------------------------------------------------------------


def size(location: str | Path) -> int:
    """Bytes under ``location`` (a file or a folder); 0 when it does not exist."""
    fs, path = filesystem(location)
    return int(fs.du(path, total=True)) if fs.exists(path) else 0


def remove(location: str | Path) -> None:
    """Delete a checkpoint folder (or any folder): its sidecar first, so it never looks complete while half deleted.
    A location that does not exist is fine."""
    fs, path = filesystem(location)
    for target, recursive in ((f"{path}/{META_FILE}", False), (path, True)):
        with suppress(FileNotFoundError):  # deleted meanwhile
            if fs.exists(target):
                fs.rm(target, recursive=recursive)


def complete(location: str | Path, segment_id: str) -> dict[int, str]:
    """Complete checkpoints of ``segment_id`` under ``location`` (folders `tokens_*` whose sidecar names it), by
    token count, each as a location (a path, or a URI spelled as ``location`` is)."""
    fs, path = filesystem(location)
    try:
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return {}
    found = {}
    for tag in sorted(n for n in names if n.startswith(TAG_PREFIX) and n[len(TAG_PREFIX):].isdigit()):
        try:
            meta = json.loads(fs.cat_file(f"{path}/{tag}/{META_FILE}"))
        except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):  # not (yet) complete
            continue
        if meta.get("segment_id") == segment_id:
            found[int(tag[len(TAG_PREFIX):])] = join(location, tag)
    return dict(sorted(found.items()))


def push(local: str | Path, uri: str) -> None:
    """Upload the folder ``local`` to ``uri`` (its files under it), `meta.json` last; a `meta.json` already there
    is removed first, so the folder never looks complete while it is being overwritten."""
    local = Path(local)
    if not (local / META_FILE).is_file():
        raise StorageError(f"{local} is not a complete checkpoint ({META_FILE} missing); refusing to push it")
    _unmark(uri)
    _push_body(local, uri)
    _push_marker(local, uri)


def _unmark(uri: str) -> None:
    fs, path = filesystem(uri)
    if fs.exists(f"{path}/{META_FILE}"):
        fs.rm_file(f"{path}/{META_FILE}")


def _push_body(local: Path, uri: str) -> None:
    """Upload every file of ``local`` but the sidecar (and this module's own dotfiles)."""
    files = sorted(f for f in local.rglob("*") if f.is_file() and f.name not in (META_FILE, PUSHED))
    fs, path = filesystem(uri)
    body = [(str(f), f"{path}/{f.relative_to(local).as_posix()}") for f in files]
    for parent in sorted({r.rsplit("/", 1)[0] for _, r in body} | {path}):
        fs.makedirs(parent, exist_ok=True)  # real folders need it (file://, sftp); object stores ignore it
    if body:
        fs.put([lp for lp, _ in body], [rp for _, rp in body])


def _push_marker(local: Path, uri: str) -> None:
    fs, path = filesystem(uri)
    fs.put_file(str(local / META_FILE), f"{path}/{META_FILE}")


# -- local copies of URIs ----------------------------------------------------------------------------------------


def staging_root(data_cache_dir: str | Path | None) -> Path:
    """Where URIs are mirrored on this node: `staging/` beside the token cache (default `<UPSCALE_HOME>/staging`)."""
    if data_cache_dir is None:
        return upscale_home().absolute() / STAGING
    return Path(data_cache_dir).absolute().parent / STAGING


def mirror(uri: str, root: Path) -> Path:
    """The local folder that stands for ``uri`` under the staging root ``root``: `<root>/<scheme>/<path>`
    (deterministic, so every segment on a node finds what another one fetched or trained)."""
    scheme = uri.split("://", 1)[0]
    _, path = filesystem(uri)
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise StorageError(f"checkpoint location {uri!r}: '..' is not allowed in a URI path")
    return root / re.sub(r"[^A-Za-z0-9._-]", "_", scheme) / Path(*parts)


def fetch(location: str, staging: Path) -> Path:
    """A parent checkpoint as a local folder: a local path as it is; for a URI, a complete copy in its mirror,
    downloaded unless this node has one (marker last). When the URI holds no checkpoint, its mirror is returned
    without one (a stale copy of a deleted checkpoint is dropped), so the caller reports what is missing."""
    if not is_uri(location):
        return Path(location)
    fs, path = filesystem(location)
    local = mirror(location, staging)
    marker = next((m for m in MARKERS if fs.isfile(f"{path}/{m}")), None)
    with _lock(local):
        if marker is None:
            if any((local / m).is_file() for m in MARKERS):
                shutil.rmtree(local, ignore_errors=True)
        elif not (local / marker).is_file():
            _download(fs, path, local, marker)
    return local


def _download(fs: AbstractFileSystem, path: str, local: Path, marker: str) -> None:
    """Copy the folder ``path`` of ``fs`` to ``local``: into a temporary sibling, marker last, then renamed."""
    files = fs.find(path)
    prefix = path.rstrip("/") + "/"
    rel = [f[len(prefix):] for f in files if f.startswith(prefix)]
    if len(rel) != len(files):
        raise StorageError(f"cannot map the files of {path} to a local folder ({files[:3]}...)")
    tmp = local.parent / f".{local.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        body = [r for r in rel if r != marker]
        for parent in {(tmp / r).parent for r in rel}:
            parent.mkdir(parents=True, exist_ok=True)
        if body:
            fs.get([prefix + r for r in body], [str(tmp / r) for r in body])
        fs.get_file(prefix + marker, str(tmp / marker))
        if local.exists():
            shutil.rmtree(local)  # an interrupted save or an incomplete copy
        os.rename(tmp, local)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _lock(local: Path) -> Iterator[None]:
    """An exclusive lock on the mirror folder ``local`` among the processes of this node."""
    local.parent.mkdir(parents=True, exist_ok=True)
    with open(local.parent / f".{local.name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        yield


class Group(Protocol):
    """The process group of a segment (workers.parallel.Ranks): rank 0 is `main`; `barrier` waits for every rank."""

    @property
    def main(self) -> bool: ...

    def barrier(self) -> None: ...


@dataclass(frozen=True)
class SegmentFolder:
    """A segment's checkpoint location and the local folder DeepSpeed writes in (the same folder for a path)."""

    location: str
    local: Path
    staging: Path | None = None  # the staging root, for a URI

    @classmethod
    def open(cls, location: str, data_cache_dir: str | None = None) -> SegmentFolder:
        if not is_uri(location):
            return cls(location, Path(location))
        root = staging_root(data_cache_dir)
        return cls(location, mirror(location, root), root)

    @property
    def remote(self) -> bool:
        return self.staging is not None

    def pull(self, segment_id: str) -> Path:
        """The local folder to train in. For a URI, reconciled with it first: only checkpoints the URI holds
        complete stay, and the newest of ``segment_id``'s is there (fetched if this node lacks it)."""
        if not self.remote:
            return self.local
        assert self.staging is not None
        with _lock(self.local):  # the ranks of a node share this folder: one reconciles it, the others find it done
            published = complete(self.location, segment_id)
            names = {uri.rsplit("/", 1)[-1] for uri in published.values()}
            if self.local.is_dir():
                for d in self.local.glob(f"{TAG_PREFIX}*"):
                    if d.name not in names or not (d / META_FILE).is_file():
                        shutil.rmtree(d, ignore_errors=True)  # saved here, never pushed (or a half copy)
            if published:
                fetch(published[max(published)], self.staging)
        return self.local

    def push(self, checkpoint: Path, ranks: Group | None = None) -> None:
        """Publish a checkpoint folder just saved in `local` (nothing to do for a path). On several ranks every rank
        calls this after `checkpoints.save`: each node uploads its ranks' files once, then rank 0 the sidecar."""
        if not self.remote:
            return
        uri = self.location_of(checkpoint)
        if ranks is None:
            push(checkpoint, uri)
            return
        if ranks.main:
            _unmark(uri)
        ranks.barrier()
        with _lock(checkpoint):
            if not (checkpoint / PUSHED).exists():
                _push_body(checkpoint, uri)
                (checkpoint / PUSHED).touch()
        ranks.barrier()  # every node's shards are at the URI
        if ranks.main:
            _push_marker(checkpoint, uri)
        ranks.barrier()  # complete at the URI for every rank that lists it next

    def remove(self, checkpoint: Path, ranks: Group | None = None) -> None:
        """Delete a checkpoint folder of `local`, its published copy first (on several ranks: rank 0 deletes what
        they share; every rank drops its node's staged copy)."""
        main = ranks is None or ranks.main
        if not self.remote:
            if main:
                remove(checkpoint)
            return
        if main:
            remove(self.location_of(checkpoint))
        (checkpoint / META_FILE).unlink(missing_ok=True)
        shutil.rmtree(checkpoint, ignore_errors=True)

    def complete(self, segment_id: str) -> dict[int, str]:
        """The segment's complete checkpoints where they are published, by token count."""
        return complete(self.location, segment_id)

    def location_of(self, checkpoint: Path) -> str:
        """What a result reports for a checkpoint folder of `local`: its URI, or its path."""
        return join(self.location, checkpoint.name) if self.remote else str(checkpoint)

    def discard(self) -> None:
        """Delete the whole folder, published and local (LR-search trials, whose weights are never reused)."""
        remove(self.location)
        if self.remote:
            shutil.rmtree(self.local, ignore_errors=True)
