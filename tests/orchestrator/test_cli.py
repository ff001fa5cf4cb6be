"""`upscale run|observations|sweeps|gc` through the real typer app, in-process on the session's embedded Ray.

Strategy: the fast tests fill the store with the counting segment function and check the exported table value by
value; the slow test runs a micro sweep with real training (`workers.segment.run_segment`) through `upscale run
--json` and feeds its CSV straight into `upscale fit`."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.orchestrator.conftest import TINY_NAIVE_SPEC, TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment, loss_of
from upscale.api.cli import app
from upscale.api.cli.run_commands import trained_report
from upscale.fitting.laws import COUNT_COLUMNS
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import get_settings
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan

pytestmark = pytest.mark.usefixtures("ray_session")

MICRO_SPEC = """
name: micro-e2e
model: {sizes: [nano]}
moe: {experts: [4], topk: [1]}
upcycling: {methods: [naive]}
tokens: {d1: [2048, 4096, 8192], d2: [2048, 4096, 8192]}
train: {context: 32, batch_size: 4, lr: {dense: 3.0e-3, moe: 2.0e-3}, warmup_tokens: 256}
data: {corpus: "builtin:python-stdlib", tokenizer: bytes, eval_tokens: 4096}
resources: {cpus: 1}
"""


@pytest.fixture
def cli(settings, monkeypatch):
    monkeypatch.setenv("UPSCALE_HOME", str(settings.home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", settings.mlflow_tracking_uri)
    get_settings.cache_clear()
    runner = CliRunner()

    def invoke(*args: str) -> str:
        result = runner.invoke(app, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    yield invoke
    get_settings.cache_clear()


def test_observations_csv_has_the_columns_fit_reads(settings, cli, tmp_path) -> None:
    orch = Orchestrator.open(settings)
    spec = load_spec(TINY_SPEC)
    out = orch.run(spec, Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05))
    df = pd.read_csv(io.StringIO(cli("observations", out.sweep_id, "--csv")))
    assert len(df) == 11 and {"N", "D", "N1", "D1", "D2", "N2", "P", "loss", "trunk"} <= set(df.columns)
    assert set(COUNT_COLUMNS) - {"N2", "P"} <= set(df.columns)
    specs = {s.id: s for s in plan(spec).segments}
    for row in df.itertuples():
        s = specs[row.segment]
        assert row.loss == pytest.approx(loss_of(s.spec), abs=1e-12) and row.trunk == s.trunk
        o = s.observation
        if row.kind in ("dense", "scratch"):  # the Chinchilla law's columns
            assert (row.N, row.D) == (o.N1, o.D) and pd.isna(row.D2)
        else:
            assert (row.N1, row.D1, row.D2, row.N2) == (o.N1, o.D1, o.D2, o.N2) and pd.isna(row.N)
            assert pytest.approx(o.N_total / o.N2) == row.P
    cli("observations", out.sweep_id, "--csv", "--kind", "upcycled", "--out", str(tmp_path / "up.csv"))
    up = pd.read_csv(tmp_path / "up.csv")
    assert len(up) == 8 and set(up["kind"]) == {"upcycled"} and up["D2"].notna().all()
    listing = cli("sweeps")
    assert out.sweep_id in listing and "26/26" in listing  # every segment of the tiny sweep done
    assert "would delete 9 checkpoint(s)" in cli("gc", "--dry-run")


@pytest.mark.slow
def test_a_micro_sweep_trains_for_real_and_feeds_upscale_fit(cli, tmp_path) -> None:
    (tmp_path / "micro.yaml").write_text(MICRO_SPEC)
    result = json.loads(cli("run", str(tmp_path / "micro.yaml"), "--json"))
    obs = result["observations"]
    assert [o["kind"] for o in obs].count("dense") == 3 and [o["kind"] for o in obs].count("upcycled") == 9
    up = {(o["D1"], o["D2"]): o["loss"] for o in obs if o["kind"] == "upcycled"}
    for d1 in (2048, 4096, 8192):  # more MoE tokens, lower loss, on every dense trunk
        assert up[(d1, 2048)] > up[(d1, 4096)] > up[(d1, 8192)]
    csv = tmp_path / "upcycled.csv"
    cli("observations", result["sweep_id"], "--csv", "--kind", "upcycled", "--out", str(csv))
    fit = json.loads(cli("fit", "--law", "data-mul-noint", "--data", str(csv), "--json"))
    assert fit["n_points"] == 9 and fit["converged"] and fit["loo_rms"] < 0.1  # loss units; 0.047 seen
    # a second run of the identical spec trains nothing: it returns the same sweep and observations
    again = json.loads(cli("run", str(tmp_path / "micro.yaml"), "--json"))
    assert again["observations"] == obs and again["sweep_id"] == result["sweep_id"]  # the same sweep, returned


def test_an_identical_spec_returns_its_sweep_unless_new(settings, cli, tmp_path) -> None:
    """`run` of a spec whose sweep is done returns that sweep without training; in-process `submit` returns it too
    (a sweep `run` made is the local owner's); `--new` records another."""
    orch = Orchestrator.open(settings)
    out = orch.run(load_spec(TINY_SPEC), Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05))
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_SPEC)
    again = json.loads(cli("run", str(path), "--json"))
    assert again["sweep_id"] == out.sweep_id and len(again["observations"]) == 11
    assert cli("submit", str(path)).split()[1] == out.sweep_id
    forced = cli("submit", str(path), "--new").split()[1]
    assert forced != out.sweep_id and len(orch.store.sweeps()) == 2
    assert cli("submit", str(path)).split()[1] == forced  # the newest identical one


def test_plan_json_new_figures_are_what_a_run_then_trains(settings, cli, tmp_path) -> None:
    orch = Orchestrator.open(settings)
    orch.run(load_spec(TINY_NAIVE_SPEC), Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05))
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_SPEC)
    grown = plan(load_spec(TINY_SPEC))
    micro_keys = {s.id for s in plan(load_spec(TINY_NAIVE_SPEC)).segments}
    figures = json.loads(cli("plan", str(path), "--json"))
    new = [s for s in grown.segments if s.id not in micro_keys]
    assert figures["segments"] == len(grown.segments) and figures["new_segments"] == len(new) > 0
    assert figures["tokens"] == sum(s.tokens for s in grown.segments) > figures["new_tokens"] == sum(
        s.tokens for s in new) > 0
    assert figures["total_flops"] == pytest.approx(grown.total_flops) and figures["new_flops"] == pytest.approx(
        sum(s.flops for s in new))
    assert figures["independent_flops"] == pytest.approx(grown.independent_flops)
    assert figures["saving"] == pytest.approx(grown.saving) and figures["stale_segments"] == {}
    assert "no segment of this plan is stale" in cli("plan", str(path), "--reuse-stale")

    out = orch.run(load_spec(TINY_SPEC), Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05))
    report = trained_report(orch, out)
    assert report["trained"]["tokens"] == figures["new_tokens"] and report["trained"]["segments"] == len(new)
    assert report["trained"]["flops"] == pytest.approx(figures["new_flops"])
    assert report["reused"] == {"segments": len(grown.segments) - len(new)}
    # `upscale run --json` of the same spec: its sweep is done, so this run trains nothing and reuses everything
    again = json.loads(cli("run", str(path), "--json"))
    assert again["sweep_id"] == out.sweep_id and len(again["observations"]) == 11
    assert again["trained"] == {"segments": 0, "tokens": 0, "flops": 0}
    assert again["reused"] == {"segments": len(grown.segments)}
    assert again["stale"] == {"segments": [], "reused": False}
    assert json.loads(cli("plan", str(path), "--json"))["new_segments"] == 0
