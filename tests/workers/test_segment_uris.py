"""Segments whose checkpoints live at an fsspec URI train exactly as with a plain path (the nano model and segments
of test_segment.py): a trunk and its decay branch through memory:// (a non-local protocol) reach the plain run's
loss bit for bit, with every checkpoint published at the URI with its sidecar; a run killed mid-segment resumes on a
"new node" (its staging folder wiped) from the checkpoint it pushed to a file:// URI, ignoring a local checkpoint it
never pushed; an upcycle and an MoE trunk fetch their parents from URIs; bad URIs are clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.workers.test_segment import DECAY, FULL, MOE, TPS, TRUNK, seg
from upscale import storage
from upscale.storage import StorageError
from upscale.sweeps.segments import SegmentRuntime, UpcycleSpec
from upscale.workers.checkpoints import tag_for
from upscale.workers.errors import WorkerError
from upscale.workers.segment import StepInfo, run_segment
from upscale.workers.weights import load_model

ROOT = "memory://uris"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("uris")


def runtime(home: Path, location: str, **kw) -> SegmentRuntime:
    """As test_segment.rt, with any location; the staging root is then <home>/staging (beside the token cache)."""
    return SegmentRuntime(checkpoint_dir=location, data_cache_dir=str(home / "cache"), log_every_steps=4, **kw)


def weights(location: str, home: Path) -> dict[str, torch.Tensor]:
    return load_model(storage.fetch(location, home / "verify") / "model")[1]


def published(location: str) -> set[str]:
    """Names of the complete checkpoint folders at ``location`` (any segment)."""
    fs, path = storage.filesystem(location)
    return {p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False) if fs.exists(f"{p}/{storage.META_FILE}")}


@pytest.fixture(scope="module")
def plain(home: Path) -> dict:
    """The reference: the trunk and the uninterrupted WSD run with plain paths."""
    return {"trunk": run_segment(TRUNK, runtime(home, str(home / "trunk"))),
            "full": run_segment(FULL, runtime(home, str(home / "full")))}


@pytest.fixture(scope="module")
def uri_runs(home: Path) -> dict:
    trunk = run_segment(TRUNK, runtime(home, f"{ROOT}/trunk"))
    decay = run_segment(DECAY, runtime(home, f"{ROOT}/decay",
                                       parent_checkpoints={TRUNK.id: trunk.branch_checkpoints[16 * TPS]}))
    return {"trunk": trunk, "decay": decay}


def test_trunk_and_decay_through_a_uri_equal_the_plain_runs(home: Path, plain: dict, uri_runs: dict) -> None:
    trunk, decay = uri_runs["trunk"], uri_runs["decay"]
    assert trunk.val_loss == plain["trunk"].val_loss
    assert {k: v for k, v in trunk.metrics.items() if k != "tokens_per_s"} == {
        k: v for k, v in plain["trunk"].metrics.items() if k != "tokens_per_s"}  # start loss, train loss, lr
    assert decay.val_loss == plain["full"].val_loss  # trunk + branch == one run, bit-exact, through the URI
    a, b = weights(decay.checkpoint, home), weights(plain["full"].checkpoint, home)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # results name URIs; each is a complete checkpoint there, sidecar included
    assert trunk.branch_checkpoints == {t: f"{ROOT}/trunk/{tag_for(t)}" for t in (16 * TPS, 20 * TPS)}
    assert trunk.checkpoint == f"{ROOT}/trunk/{tag_for(20 * TPS)}"
    assert decay.checkpoint == f"{ROOT}/decay/{tag_for(20 * TPS)}"
    assert published(f"{ROOT}/trunk") == {tag_for(16 * TPS), tag_for(20 * TPS)}
    fs, path = storage.filesystem(decay.checkpoint)
    meta = json.loads(fs.cat_file(f"{path}/meta.json"))
    assert meta["segment_id"] == DECAY.id and meta["tokens"] == 20 * TPS and meta["phase"] == "decay"
    assert fs.exists(f"{path}/mp_rank_00_model_states.pt") and fs.exists(f"{path}/model/weights.pt")
    # DeepSpeed wrote in the URI's local mirror, beside the token cache
    assert (home / "staging" / "memory" / "uris" / "trunk" / tag_for(16 * TPS) / "meta.json").is_file()


def test_a_killed_run_resumes_from_the_checkpoint_it_pushed(home: Path, plain: dict) -> None:
    class Killed(Exception):
        pass

    def kill_at_step_10(info: StepInfo) -> None:
        if info.step == 10:
            raise Killed

    location = f"file://{home / 'remote' / 'killed'}"
    rt = runtime(home, location, checkpoint_every_tokens=4 * TPS)
    with pytest.raises(Killed):
        run_segment(FULL, rt, on_step=kill_at_step_10)
    # pushed after every save; the periodic checkpoint at 4 steps was superseded, and removed at the URI as well
    assert storage.complete(location, FULL.id) == {8 * TPS: f"{location}/{tag_for(8 * TPS)}"}
    assert published(location) == {tag_for(8 * TPS)}
    # the node is lost: its staging holds nothing of the pushed checkpoint, and a later one it never pushed
    local = home / "staging" / "file" / Path(*(home / "remote" / "killed").parts[1:])
    shutil.copytree(local / tag_for(8 * TPS), local / tag_for(11 * TPS))
    meta = json.loads((local / tag_for(11 * TPS) / "meta.json").read_text())
    (local / tag_for(11 * TPS) / "meta.json").write_text(json.dumps({**meta, "tokens": 11 * TPS}))
    shutil.rmtree(local / tag_for(8 * TPS))
    resumed = run_segment(FULL, rt)
    assert resumed.val_loss == plain["full"].val_loss  # resumed from 8 steps (from 11 it would differ)
    assert "val_loss_start" not in resumed.metrics  # it resumed; it did not start over
    assert resumed.checkpoint == f"{location}/{tag_for(20 * TPS)}"
    assert published(location) == {tag_for(20 * TPS)}  # every periodic checkpoint superseded and removed
    assert not (local / tag_for(11 * TPS)).exists()


def test_upcycle_and_moe_trunk_fetch_their_parents_from_uris(home: Path, plain: dict, uri_runs: dict) -> None:
    up = seg("upcycle", MOE, upcycle=UpcycleSpec(method="naive"), parent_ids=(DECAY.id,))
    shutil.rmtree(home / "staging")  # a fresh node: the parent is downloaded, not found in the mirror
    upr = run_segment(up, runtime(home, f"{ROOT}/upcycle", parent_checkpoints={DECAY.id: uri_runs["decay"].checkpoint}))
    assert upr.checkpoint == f"{ROOT}/upcycle/upcycled" and published(f"{ROOT}/upcycle") == {"upcycled"}
    assert storage.exists(f"{upr.checkpoint}/meta.json") and storage.exists(f"{upr.checkpoint}/model/config.json")
    reference = run_segment(up, runtime(home, str(home / "upcycle"),
                                        parent_checkpoints={DECAY.id: plain["full"].checkpoint}))
    a, b = weights(upr.checkpoint, home), weights(reference.checkpoint, home)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    shutil.rmtree(home / "staging")
    moe = seg("moe_trunk", MOE, end_tokens=TPS, save_at_tokens=(TPS,), parent_ids=(up.id,))
    res = run_segment(moe, runtime(home, f"{ROOT}/moe", parent_checkpoints={up.id: upr.checkpoint}))
    # naive upcycling preserves the function: the MoE starts at its dense parent's loss (as in test_segment)
    assert res.metrics["val_loss_start"] == pytest.approx(plain["full"].val_loss, abs=1e-5)
    assert res.checkpoint == f"{ROOT}/moe/{tag_for(TPS)}" and published(f"{ROOT}/moe") == {tag_for(TPS)}


def test_bad_uris_are_clear_errors(home: Path, uri_runs: dict) -> None:
    with pytest.raises(StorageError, match=r"'nosuch://x': Protocol not known: nosuch\. Use a local path or a URI"):
        run_segment(FULL, runtime(home, "nosuch://x"))
    with pytest.raises(WorkerError, match=r"exactly one parent checkpoint holding a model; \['memory://uris/nowhere'\] "
                                          r"does not exist"):
        run_segment(DECAY, runtime(home, f"{ROOT}/d2", parent_checkpoints={TRUNK.id: f"{ROOT}/nowhere"}))
    # a parent deleted at the URI (garbage collection) is missing, even on a node that still has a copy of it
    copy = f"{ROOT}/copy/{tag_for(16 * TPS)}"
    storage.push(storage.fetch(uri_runs["trunk"].branch_checkpoints[16 * TPS], home / "staging"), copy)
    assert (storage.fetch(copy, home / "staging") / "meta.json").is_file()
    storage.remove(copy)
    with pytest.raises(WorkerError, match=r"\['memory://uris/copy/tokens_000000000004096'\] does not exist"):
        run_segment(DECAY, runtime(home, f"{ROOT}/d3", parent_checkpoints={TRUNK.id: copy}))


def test_cli_train_segment_to_a_uri(home: Path, uri_runs: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from upscale.api.cli import app

    spec_file = home / "decay.json"
    spec_file.write_text(DECAY.model_dump_json())
    monkeypatch.setenv("UPSCALE_HOME", str(home))  # the token cache under <home>/data
    out = CliRunner().invoke(app, ["train-segment", str(spec_file), "--json", "--checkpoint-dir", f"{ROOT}/cli",
                                   "--parent", uri_runs["trunk"].branch_checkpoints[16 * TPS]])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["checkpoint"] == f"{ROOT}/cli/{tag_for(20 * TPS)}"  # not mangled into a path
    assert result["val_loss"] == uri_runs["decay"].val_loss
