"""run_segment end to end on the built-in corpus with a nano model (2 layers, d=32, context 32, batch 8 = 256
tokens/step): trunk + decay branch == one uninterrupted WSD run (bit-exact weights and loss on CPU); a run killed
by an exception in its step hook and restarted resumes to the same loss; validation loss falls; the upcycled MoE
starts at its dense parent's validation loss; MLflow gets the metrics; each bad input is a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from upscale.sweeps.run_tags import si
from upscale.sweeps.segments import (
    DataSpec,
    ModelSpec,
    OptimSpec,
    ScheduleSpec,
    SegmentRuntime,
    SegmentSpec,
    UpcycleSpec,
)
from upscale.workers.checkpoints import tag_for
from upscale.workers.errors import WorkerError
from upscale.workers.segment import NaNLossError, StepInfo, run_segment
from upscale.workers.weights import load_model

TPS = 256  # tokens per step
DENSE = ModelSpec(n_layer=2, d_model=32, n_head=2, vocab_size=256, context=32)
MOE = DENSE.model_copy(update={"n_expert": 4, "topk": 2})
DATA = DataSpec(eval_tokens=2048)
OPTIM = OptimSpec(lr=3e-3, batch_size=8)
SCHED = ScheduleSpec(warmup_tokens=4 * TPS)


def seg(kind: str, model: ModelSpec = DENSE, **kw) -> SegmentSpec:
    extra = {} if kind == "upcycle" else {"optim": OPTIM, "schedule": SCHED}
    return SegmentSpec(kind=kind, model=model, data=DATA, **extra, **kw)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("segments")


def rt(home: Path, name: str, **kw) -> SegmentRuntime:
    return SegmentRuntime(checkpoint_dir=str(home / name), data_cache_dir=str(home / "cache"), log_every_steps=4, **kw)


def weights(checkpoint: str) -> dict[str, torch.Tensor]:
    return load_model(Path(checkpoint) / "model")[1]


TRUNK = seg("dense_trunk", end_tokens=20 * TPS, save_at_tokens=(16 * TPS, 20 * TPS))
DECAY = seg("dense_decay", start_tokens=16 * TPS, end_tokens=20 * TPS, decay_start_tokens=16 * TPS,
            parent_ids=(TRUNK.id,))
FULL = seg("dense_decay", end_tokens=20 * TPS, decay_start_tokens=16 * TPS)  # one uninterrupted WSD run


@pytest.fixture(scope="module")
def runs(home: Path) -> dict:
    trunk = run_segment(TRUNK, rt(home, "trunk", mlflow_tracking_uri=f"sqlite:///{home / 'mlflow.db'}",
                                  mlflow_tags={"sweep": "test"}, eval_every_tokens=8 * TPS))
    decay = run_segment(DECAY, rt(home, "decay", parent_checkpoints={TRUNK.id: trunk.branch_checkpoints[16 * TPS]}))
    full = run_segment(FULL, rt(home, "full"))
    return {"trunk": trunk, "decay": decay, "full": full}


def test_trunk_plus_decay_equals_one_uninterrupted_run(runs: dict) -> None:
    trunk, decay, full = runs["trunk"], runs["decay"], runs["full"]
    assert set(trunk.branch_checkpoints) == {16 * TPS, 20 * TPS}
    assert decay.tokens == 4 * TPS and full.tokens == 20 * TPS
    assert decay.val_loss == full.val_loss  # bit-exact on CPU
    a, b = weights(decay.checkpoint), weights(full.checkpoint)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert decay.val_loss != trunk.val_loss  # the decay really changed something
    meta = json.loads((Path(decay.checkpoint) / "meta.json").read_text())
    assert meta["segment_id"] == DECAY.id and meta["parent_ids"] == [TRUNK.id] and meta["phase"] == "decay"


def test_a_trunk_continued_in_chunks_equals_the_whole_trunk(home: Path, runs: dict) -> None:
    # how the orchestrator's LR search runs a trial: trunk segments chained through their final checkpoints
    rest = seg("dense_trunk", start_tokens=16 * TPS, end_tokens=20 * TPS, parent_ids=(TRUNK.id,))
    branch16 = runs["trunk"].branch_checkpoints[16 * TPS]
    res = run_segment(rest, rt(home, "chunk", parent_checkpoints={TRUNK.id: branch16}))
    assert res.val_loss == runs["trunk"].val_loss
    a, b = weights(res.checkpoint), weights(runs["trunk"].checkpoint)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_result_holds_every_validation_of_the_segment(runs: dict) -> None:
    trunk, decay = runs["trunk"], runs["decay"]
    # the start, every eval_every_tokens (8 steps) before the end, and the end
    assert [t for t, _ in trunk.curve] == [0, 8 * TPS, 16 * TPS, 20 * TPS]
    assert trunk.curve[0][1] == trunk.metrics["val_loss_start"] and trunk.curve[-1][1] == trunk.val_loss
    # a decay branch: its own points only, on the absolute token axis, starting where the trunk was at its branch point
    assert [t for t, _ in decay.curve] == [16 * TPS, 20 * TPS]
    assert decay.curve[0][1] == dict(trunk.curve)[16 * TPS] and decay.curve[-1][1] == decay.val_loss


def test_validation_loss_falls(runs: dict) -> None:
    # nano dense on the Python stdlib: from ~ln(256)=5.55 to below 4.0 within 20 steps (5,120 tokens) at lr 3e-3
    trunk = runs["trunk"]
    assert trunk.metrics["val_loss_start"] == pytest.approx(5.55, abs=0.1)
    assert trunk.metrics["val_loss_start"] - trunk.val_loss > 1.5
    assert trunk.val_loss < 4.0


def test_killed_run_resumes_to_the_same_loss(home: Path, runs: dict) -> None:
    class Killed(Exception):
        pass

    def kill_at_step_10(info: StepInfo) -> None:
        if info.step == 10:
            raise Killed

    runtime = rt(home, "killed", checkpoint_every_tokens=4 * TPS, eval_every_tokens=4 * TPS)
    with pytest.raises(Killed):
        run_segment(FULL, runtime, on_step=kill_at_step_10)
    saved = sorted(p.name for p in (home / "killed").glob("tokens_*"))
    assert saved == ["tokens_000000000002048"]  # the periodic checkpoint at 8 steps; the one at 4 was superseded
    resumed = run_segment(FULL, runtime)
    assert resumed.val_loss == runs["full"].val_loss
    assert "val_loss_start" not in resumed.metrics  # it resumed; it did not start over
    # the points before the kill came back from the checkpoint's sidecar; the whole curve is the uninterrupted one's
    tokens, losses = zip(*resumed.curve, strict=True)
    assert tokens == tuple(range(0, 20 * TPS + 1, 4 * TPS))
    trunk = dict(runs["trunk"].curve)  # the same run as FULL until its decay starts at 16 steps
    assert [dict(resumed.curve)[t] for t in (0, 8 * TPS, 16 * TPS)] == [trunk[t] for t in (0, 8 * TPS, 16 * TPS)]
    assert losses[-1] == resumed.val_loss


def test_upcycled_moe_starts_at_its_dense_parents_loss_and_trains(home: Path, runs: dict) -> None:
    up = seg("upcycle", MOE, upcycle=UpcycleSpec(method="naive"), parent_ids=(DECAY.id,))
    upr = run_segment(up, rt(home, "upcycle", parent_checkpoints={DECAY.id: runs["decay"].checkpoint}))
    assert upr.val_loss is None and upr.tokens == 0
    moe = seg("moe_trunk", MOE, end_tokens=4 * TPS, save_at_tokens=(4 * TPS,), parent_ids=(up.id,))
    res = run_segment(moe, rt(home, "moe", parent_checkpoints={up.id: upr.checkpoint}))
    # naive copies + DeepSpeed's renormalised top-2 + no dropping: the same function (docs/methods.md, "Two identities")
    assert res.metrics["val_loss_start"] == pytest.approx(runs["decay"].val_loss, abs=1e-5)
    assert res.val_loss < res.metrics["val_loss_start"]
    assert res.metrics["aux_loss"] > 0 and res.metrics["load_max_over_mean"] >= 1.0
    sd = weights(res.checkpoint)
    assert any(".deepspeed_experts.3." in k for k in sd)


def test_scratch_moe_trunk_and_decay(home: Path) -> None:
    trunk = seg("scratch_trunk", MOE, end_tokens=6 * TPS, save_at_tokens=(5 * TPS, 6 * TPS))
    tr = run_segment(trunk, rt(home, "scratch"))
    dec = seg("scratch_decay", MOE, start_tokens=5 * TPS, end_tokens=6 * TPS, decay_start_tokens=5 * TPS,
              parent_ids=(trunk.id,))
    dr = run_segment(dec, rt(home, "scratch_dec", parent_checkpoints={trunk.id: tr.branch_checkpoints[5 * TPS]}))
    assert dr.val_loss < tr.metrics["val_loss_start"] - 0.3  # 6 steps, 4 of them warmup
    assert dr.tokens_per_s > 0


def test_loss_free_trunk_plus_decay_equals_one_run(home: Path) -> None:
    # the routing bias is saved at the branch point and restored by the decay: bit-exact with an uninterrupted run
    moe = MOE.model_copy(update={"balancing": "loss_free", "balancing_rate": 0.01})
    trunk = seg("scratch_trunk", moe, end_tokens=6 * TPS, save_at_tokens=(4 * TPS, 6 * TPS))
    tr = run_segment(trunk, rt(home, "loss_free_trunk"))
    dec = seg("scratch_decay", moe, start_tokens=4 * TPS, end_tokens=6 * TPS, decay_start_tokens=4 * TPS,
              parent_ids=(trunk.id,))
    dr = run_segment(dec, rt(home, "loss_free_decay", parent_checkpoints={trunk.id: tr.branch_checkpoints[4 * TPS]}))
    full = run_segment(seg("scratch_decay", moe, end_tokens=6 * TPS, decay_start_tokens=4 * TPS),
                       rt(home, "loss_free_full"))
    a, b = weights(dr.checkpoint), weights(full.checkpoint)
    assert all(torch.equal(a[k], b[k]) for k in a) and dr.val_loss == full.val_loss
    branch = weights(tr.branch_checkpoints[4 * TPS])
    bias = [k for k in a if k.endswith("gate.route_bias")]
    assert len(bias) == moe.n_layer and all(not torch.equal(a[k], branch[k]) for k in bias)  # moved in the decay


def test_mlflow_receives_metrics_and_tags(home: Path, runs: dict) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("upscale").experiment_id])
    assert run.data.tags["upscale.segment_id"] == TRUNK.id and run.data.params["kind"] == "dense_trunk"
    assert run.data.tags["sweep"] == "test" and run.data.params["d_model"] == "32"
    assert run.info.run_name.startswith("dense · L") and run.info.status == "FINISHED"
    assert run.info.run_name.endswith(f" · trunk 0–{si(20 * TPS)} tok")  # alone: its shape and span name it
    val = client.get_metric_history(run.info.run_id, "loss/val")
    assert [m.step for m in val] == [0, 8 * TPS, 16 * TPS, 20 * TPS]  # start, every 8 steps, end
    assert val[0].value > val[1].value > val[2].value
    assert val[-1].value == pytest.approx(runs["trunk"].val_loss)
    train = client.get_metric_history(run.info.run_id, "loss/train")
    assert [m.step for m in train] == [4 * TPS, 8 * TPS, 12 * TPS, 16 * TPS, 20 * TPS]
    assert {"optim/lr", "speed/tokens_per_s"} <= set(run.data.metrics)
    assert run.data.params["lr"] == str(TRUNK.optim.lr)  # a param, not a metric


def test_nan_loss_stops_names_the_step_and_keeps_the_last_checkpoint(home: Path) -> None:
    # lr 1e30: Adam's first update moves every weight by ~1e30; within a few steps the loss overflows to NaN
    bad = seg("dense_trunk", end_tokens=4 * TPS, save_at_tokens=(4 * TPS,)).model_copy(
        update={"optim": OPTIM.model_copy(update={"lr": 1e30}), "schedule": ScheduleSpec(warmup_tokens=0)})
    with pytest.raises(NaNLossError, match=r"non-finite at step \d+ \(\d+ tokens\)") as e:
        run_segment(bad, rt(home, "nan", checkpoint_every_tokens=TPS))
    step = e.value.step
    assert 1 <= step < 4 and f"at step {step} ({step * TPS} tokens)" in str(e.value)
    # every step before the NaN was checkpointed; the last good one (after step - 1) is kept
    assert e.value.last_checkpoint == home / "nan" / tag_for(step * TPS)
    assert (e.value.last_checkpoint / "meta.json").is_file()


def test_bad_inputs_are_clear_errors(home: Path, runs: dict) -> None:
    branch16 = runs["trunk"].branch_checkpoints[16 * TPS]
    with pytest.raises(ValueError, match="save_at_tokens"):  # a branch point past the trunk's end
        seg("dense_trunk", end_tokens=4 * TPS, save_at_tokens=(8 * TPS,))
    off = seg("dense_decay", start_tokens=12 * TPS, end_tokens=14 * TPS, decay_start_tokens=12 * TPS,
              parent_ids=(TRUNK.id,))
    with pytest.raises(WorkerError, match="branch point is not one the trunk saved"):
        run_segment(off, rt(home, "off", parent_checkpoints={TRUNK.id: branch16}))
    wide = DECAY.model_copy(update={"model": DENSE.model_copy(update={"d_model": 64, "n_head": 4})})
    with pytest.raises(WorkerError, match=r"different model shape.*d_model: checkpoint 32 vs segment 64"):
        run_segment(wide, rt(home, "wide", parent_checkpoints={TRUNK.id: branch16}))
    short = seg("dense_decay", end_tokens=4 * TPS, decay_start_tokens=2 * TPS)  # warmup is 4 steps
    with pytest.raises(WorkerError, match="budget too small for the warmup"):
        run_segment(short, rt(home, "short"))
    with pytest.raises(WorkerError, match="checkpoint_every_tokens=100 must be a positive multiple of"):
        run_segment(FULL, rt(home, "every", checkpoint_every_tokens=100))
    missing = seg("dense_trunk", end_tokens=TPS).model_copy(update={"data": DataSpec(corpus=str(home / "none"))})
    with pytest.raises(WorkerError, match="does not exist"):
        run_segment(missing, rt(home, "missing"))


def test_cli_train_segment_json(home: Path, runs: dict, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from upscale.api.cli import app, main

    spec_file = home / "decay.json"
    spec_file.write_text(DECAY.model_dump_json())
    parent = runs["trunk"].branch_checkpoints[16 * TPS]
    monkeypatch.setenv("UPSCALE_HOME", str(home))  # the token cache under <home>/data
    out = CliRunner().invoke(app, ["train-segment", str(spec_file), "--json", "--checkpoint-dir",
                                   str(home / "cli"), "--parent", parent])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)  # stdout holds the JSON alone (DeepSpeed's logging goes to stderr)
    assert set(result) == {"val_loss", "tokens", "wall_s", "tokens_per_s", "checkpoint"}
    assert result["val_loss"] == runs["decay"].val_loss and result["tokens"] == 4 * TPS
    assert Path(result["checkpoint"]).parent == home / "cli"

    spec_file.write_text(DECAY.model_dump_json())
    monkeypatch.setattr("sys.argv", ["upscale", "train-segment", str(spec_file), "--checkpoint-dir",
                                     str(home / "cli2"), "--parent", str(home / "nowhere")])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_trunks_ignore_lr_search_parents_and_need_a_resolved_lr(home: Path) -> None:
    # the orchestrator passes an lr_search parent's folder (no model in it) and has already set optim.lr
    trunk = seg("dense_trunk", end_tokens=TPS, parent_ids=("lrsearch0000000",))
    res = run_segment(trunk, rt(home, "lr_child", parent_checkpoints={"lrsearch0000000": str(home / "no-such")}))
    assert res.metrics["val_loss_start"] == pytest.approx(5.55, abs=0.1)  # trained from a fresh init
    with pytest.raises(WorkerError, match=r"optim.lr is None"):
        run_segment(trunk.model_copy(update={"optim": OPTIM.model_copy(update={"lr": None})}), rt(home, "nolr"))
    moe = seg("moe_trunk", MOE, end_tokens=TPS, parent_ids=("up", "lrs"))
    with pytest.raises(WorkerError, match=r"exactly one parent checkpoint holding a model; .* does not exist"):
        run_segment(moe, rt(home, "moe_nop", parent_checkpoints={"up": str(home / "x"), "lrs": str(home / "y")}))


@pytest.mark.slow
def test_sigkilled_process_resumes_to_the_same_loss(home: Path, runs: dict) -> None:
    import signal
    import subprocess
    import sys
    import time

    runtime = rt(home, "sigkill", checkpoint_every_tokens=4 * TPS)
    code = ("import sys, time, torch; torch.set_num_threads(1)\n"
            "from upscale.sweeps.segments import SegmentSpec, SegmentRuntime\n"
            "from upscale.workers.segment import run_segment\n"
            "spec = SegmentSpec.model_validate_json(sys.argv[1])\n"
            "rt = SegmentRuntime.model_validate_json(sys.argv[2])\n"
            "run_segment(spec, rt, on_step=lambda info: time.sleep(0.3))\n")
    # a fresh process; it inherits this one's MASTER_PORT, which init_single_process must not reuse
    log = home / "sigkill.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", code, FULL.model_dump_json(), runtime.model_dump_json()],
                                cwd=home, stdout=out, stderr=out)
    marker = home / "sigkill" / tag_for(8 * TPS) / "meta.json"
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert marker.exists(), log.read_text()[-2000:]
    assert not (home / "sigkill" / tag_for(20 * TPS)).exists()  # killed mid-segment
    resumed = run_segment(FULL, runtime)
    assert resumed.val_loss == runs["full"].val_loss
