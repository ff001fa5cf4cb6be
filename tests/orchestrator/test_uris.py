"""A sweep whose checkpoint root is an fsspec URI (file://, opened through fsspec like s3://) trains for real on the
session's embedded Ray, adopts a segment a dead scheduler's worker finished, records URIs, and garbage-collects
through fsspec; a checkpoint root nothing can open is refused when the settings are read.

Strategy: a five-segment sweep (dense trunk, decay, naive upcycle, MoE trunk, MoE decay) with real training
(`workers.segment.run_segment`). Its dense trunk is trained in this process first and its result left at the URI,
as by the worker of a scheduler that died before recording it: the scheduler must adopt it, not train it again,
and its children must start from its checkpoints at the URI."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from upscale import storage
from upscale.orchestrator.attempt_files import RESULT_FILE, WORKER_FILE, read_result, worker_running, write_result
from upscale.orchestrator.gc import collect_garbage
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import Settings
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import LrSearchSpec, SegmentResult, SegmentRuntime, SegmentSpec

URI_SPEC = """
name: uri-root
model: {sizes: [nano]}
moe: {experts: [4], topk: [1]}
upcycling: {methods: [naive]}
tokens: {d1: [512], d2: [256]}
train: {context: 16, batch_size: 4, lr: {dense: 3.0e-3, moe: 2.0e-3}, warmup_tokens: 64}
data: {eval_tokens: 1024}
resources: {cpus: 1}
"""


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.slow  # ~85 s on 2 cores
@pytest.mark.usefixtures("ray_session")
def test_a_sweep_with_a_uri_checkpoint_root_trains_adopts_and_collects(tmp_path: Path, mlflow_uri: str) -> None:
    remote = tmp_path / "remote"
    root = f"file://{remote}"
    settings = Settings(home=tmp_path / "home", mlflow_tracking_uri=mlflow_uri, checkpoint_dir=root)
    orch = Orchestrator.open(settings)
    spec = load_spec(URI_SPEC)
    segments = {s.id: s for s in plan(spec).segments}
    assert sorted(s.spec.kind for s in segments.values()) == sorted(
        ["dense_trunk", "dense_decay", "upcycle", "moe_trunk", "moe_decay"])
    sweep = orch.submit(spec)
    scheduler = Scheduler(orch.store, settings, poll_s=0.05)
    assert scheduler.segment_dir("abc") == f"{root}/abc"  # '/'-joined: pathlib would make it file:/...

    # a scheduler claimed the trunk and died; its worker finished and left the result at the URI
    trunk = next(s for s in segments.values() if s.spec.kind == "dense_trunk")
    assert orch.store.claim(trunk.id, f"{socket.gethostname()}:{dead_pid()}:dead00") is not None
    from upscale.workers.segment import run_segment

    trunk_dir = scheduler.segment_dir(trunk.id)
    done = run_segment(trunk.spec, SegmentRuntime(checkpoint_dir=trunk_dir, data_cache_dir=str(settings.home / "data")))
    write_result(trunk_dir, done)
    assert read_result(trunk_dir, trunk.id) == done and read_result(trunk_dir, "another") is None
    storage.write_text(trunk_dir, WORKER_FILE, f'{{"host": "{socket.gethostname()}", "pid": {dead_pid()}}}')
    assert not worker_running(trunk_dir)  # its process is gone: adopt the result
    storage.delete(trunk_dir, WORKER_FILE)

    out = scheduler.run(sweep.id)
    assert out.status == "done", [(s.kind, s.error) for s, _ in orch.store.members(sweep.id) if s.error]
    assert out.adopted == [trunk.id] and sorted(out.trained) == sorted(set(segments) - {trunk.id})
    for key, s in segments.items():
        result = SegmentResult.model_validate(orch.store.segment(key).result)
        assert result.checkpoint is not None and result.checkpoint.startswith(f"{root}/{key}/"), result.checkpoint
        assert all(u.startswith(f"{root}/{key}/") for u in result.branch_checkpoints.values())
        assert (remote / key / RESULT_FILE).is_file() and not (remote / key / WORKER_FILE).exists()
        assert (remote / result.checkpoint.removeprefix(f"{root}/") / "meta.json").is_file()
        assert read_result(scheduler.segment_dir(key), key) == result
        if s.spec.kind in ("dense_decay", "moe_decay"):
            assert result.val_loss is not None and 2.0 < result.val_loss < 5.6  # trained: below ln(256)
    obs = orch.store.observations(sweep.id)
    assert sorted(o.kind for o in obs) == ["dense", "upcycled"]

    # garbage collection deletes through fsspec: the finished MoE decay's final checkpoint, nothing else
    leaf = next(k for k, s in segments.items() if s.spec.kind == "moe_decay")
    leaf_uri = orch.store.segment(leaf).result["checkpoint"]
    leaf_dir = remote / leaf_uri.removeprefix(f"{root}/")
    dry = collect_garbage(orch.store, dry_run=True)
    assert dry.deleted == [leaf_uri] and leaf_dir.is_dir()
    assert dry.freed_bytes == sum(p.stat().st_size for p in leaf_dir.rglob("*") if p.is_file()) > 0
    report = collect_garbage(orch.store)
    assert report.deleted == [leaf_uri] and not leaf_dir.exists() and (remote / leaf / RESULT_FILE).is_file()
    assert report.kept and all(storage.exists(u) for u in report.kept)


def test_a_checkpoint_root_nothing_can_open_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"UPSCALE_CHECKPOINT_DIR: checkpoint location 'nosuch://x': Protocol "
                                              r"not known: nosuch\. Use a local path or a URI"):
        Settings(home=tmp_path, checkpoint_dir="nosuch://x")
    if importlib.util.find_spec("s3fs") is None:
        with pytest.raises(ValidationError, match=r"Install s3fs.*s3fs for s3://"):
            Settings(home=tmp_path, checkpoint_dir="s3://bucket/upscale")
    assert Settings(home=tmp_path, checkpoint_dir="file:///srv/ckpt").checkpoint_dir == "file:///srv/ckpt"
    assert Settings(home=tmp_path).checkpoint_dir == str(tmp_path.absolute() / "checkpoints")


@pytest.mark.slow  # ~30 s on 2 cores: a real LR search over a URI store
def test_lr_search_trials_at_a_uri_chain_their_chunks_and_leave_nothing_behind(tmp_path: Path) -> None:
    # a trial of two one-step trunk chunks, the second starting from the first one's checkpoint at the URI
    from tests.workers.test_segment import DATA, DENSE, OPTIM, SCHED, TPS
    from upscale.orchestrator.lr_search import run_lr_search
    from upscale.workers.segment import run_segment

    spec = SegmentSpec(kind="lr_search", model=DENSE, data=DATA, optim=OPTIM.model_copy(update={"lr": None}),
                       schedule=SCHED, lr_search=LrSearchSpec(trials=1, low=1e-3, high=1e-2, tokens=2 * TPS))
    root = "memory://lr-search/seg"
    chunks: list[str] = []

    def train(chunk: SegmentSpec, rt: SegmentRuntime) -> SegmentResult:
        chunks.append(rt.checkpoint_dir)
        result = run_segment(chunk, rt)
        assert storage.exists(f"{result.checkpoint}/meta.json")  # published where the next chunk fetches it
        return result

    rt = SegmentRuntime(checkpoint_dir=root, data_cache_dir=str(tmp_path / "cache"))
    result = run_lr_search(spec, rt, f"sqlite:///{tmp_path / 'optuna.db'}", train)
    assert result.metrics["trials"] == 1 and 1e-3 <= result.best_lr <= 1e-2 and result.tokens == 2 * TPS
    assert chunks == [f"{root}/trial-0/chunk-{k}" for k in range(2)]
    assert not storage.exists(f"{root}/trial-0")  # trial weights are deleted at the URI
    assert not (tmp_path / "staging" / "memory" / "lr-search" / "seg" / "trial-0").exists()  # and their staging


@pytest.mark.slow  # two Ray Train groups: ~110 s on 2 cores
@pytest.mark.usefixtures("ray_session")
def test_a_two_worker_segment_publishes_every_ranks_shards_and_branches_from_them(tmp_path: Path) -> None:
    """A 4x2 MoE trunk on a Ray Train group of two (expert parallel: each rank writes its own shards) with a
    file:// root, then its decay branch on two workers from the URI with the staging wiped (both ranks fetch the
    branch point at once): both match the single-process runs with plain paths (tolerance of test_worker_group)."""
    from tests.orchestrator.test_worker_group import COMMON, REL_TOL, TPS, on_ray
    from upscale.workers.segment import run_segment

    trunk = SegmentSpec(kind="scratch_trunk", end_tokens=8 * TPS, save_at_tokens=(6 * TPS, 8 * TPS), **COMMON)
    decay = SegmentSpec(kind="scratch_decay", start_tokens=6 * TPS, end_tokens=8 * TPS, decay_start_tokens=6 * TPS,
                        parent_ids=(trunk.id,), **COMMON)

    def rt(location: str, workers: int, **kw) -> SegmentRuntime:
        return SegmentRuntime(checkpoint_dir=location, data_cache_dir=str(tmp_path / "cache"), workers=workers,
                              num_threads=1, log_every_steps=4, **kw)

    root = f"file://{tmp_path / 'remote'}"
    two = SegmentResult.model_validate(on_ray(trunk, rt(f"{root}/trunk", 2)))
    one = run_segment(trunk, rt(str(tmp_path / "trunk-1"), 1))
    assert two.val_loss == pytest.approx(one.val_loss, rel=REL_TOL)
    assert two.branch_checkpoints == {t: f"{root}/trunk/tokens_{t:015d}" for t in (6 * TPS, 8 * TPS)}
    published = tmp_path / "remote" / "trunk" / f"tokens_{6 * TPS:015d}"
    local = tmp_path / "trunk-1" / f"tokens_{6 * TPS:015d}"
    names = {p.relative_to(published).as_posix() for p in published.rglob("*") if p.is_file()}
    assert storage.META_FILE in names and storage.PUSHED not in names
    # every file DeepSpeed wrote on either rank is there: the one-process files plus rank 1's expert shards
    assert {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()} < names
    assert any("expp_rank_1" in n or "_1_mp_rank" in n for n in names), sorted(names)
    shutil.rmtree(tmp_path / "staging")  # a fresh node: both ranks fetch the branch point
    decay_two = SegmentResult.model_validate(on_ray(decay, rt(f"{root}/decay", 2, parent_checkpoints={
        trunk.id: two.branch_checkpoints[6 * TPS]})))
    decay_one = run_segment(decay, rt(str(tmp_path / "decay-1"), 1, parent_checkpoints={
        trunk.id: one.branch_checkpoints[6 * TPS]}))
    assert decay_two.val_loss == pytest.approx(decay_one.val_loss, rel=REL_TOL)
    assert decay_two.checkpoint == f"{root}/decay/tokens_{8 * TPS:015d}"
    assert (tmp_path / "remote" / "decay" / f"tokens_{8 * TPS:015d}" / "meta.json").is_file()
