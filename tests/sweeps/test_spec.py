"""Spec validation: each mistake a user can make gives a message at its field path, all of them at once.

Strategy: start from a valid small spec (conftest.SMALL_SPEC), break one thing, and check the exact path and the
words that tell the user what to fix; then break several things in one spec and check every one is reported.
"""

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan
from upscale.sweeps.resources import ClusterResources, check_resources
from upscale.sweeps.spec import SpecError, parse_spec

UPSCALE = Path(__file__).parents[2] / ".venv" / "bin" / "upscale"


def _set(path: str, value: object) -> Callable[[dict], None]:
    def apply(d: dict) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d.setdefault(p, {})
        d[last] = value
    return apply


def _lr_search_and_size_lr(d: dict) -> None:
    d["train"].update(lr=None, lr_search={"trials": 2, "low": 1e-4, "high": 1e-2, "tokens": 8192})
    d["per_size"] = {"nano": {"lr": {"dense": 1e-3, "moe": 1e-3}}}


CASES = [
    (_set("moe.topk", [2, 8]), "moe.topk[1]", "topk=8 exceeds experts=4"),
    # one expert is no MoE: the worker would build it dense, so a "from-scratch MoE" would train a dense model
    (_set("moe", {"experts": [4, 1], "topk": [1]}), "moe.experts[1]", "must be >= 2, got 1 (an MoE has at least 2"),
    (_set("tokens.d1", []), "tokens.d1", "empty budget list"),
    (_set("tokens.d2", [40960, 20480]), "tokens.d2[1]", "sorted ascending"),
    (_set("tokens.d2", [20480, 20480]), "tokens.d2[1]", "duplicate budget"),
    (_set("tokens.scratch", [-5]), "tokens.scratch[0]", "greater than 0"),
    (_set("upcycling.r", [0.5, 1.5]), "upcycling.r[1]", "less than or equal to 1"),
    (_set("upcycling.r", [0.5, 0.5]), "upcycling.r[1]", "listed twice"),
    (_set("model.sizes", ["nano", "huge"]), "model.sizes[1]", "unknown size 'huge'"),
    (_set("model.sizes", ["nano", {"n_layer": 2, "d_model": 30, "n_head": 4}]), "model.sizes[1]", "not divisible"),
    (_set("model.sizes", [{"n_layer": 0, "d_model": 32, "n_head": 2}]), "model.sizes[0].n_layer", "greater than"),
    (_set("model.sizes", ["nano", "nano"]), "model.sizes[1]", "listed twice"),
    (_set("upcycling.methods", ["naive", "magic"]), "upcycling.methods[1]", "unknown value 'magic'"),
    (_set("upcycling.options", {"drop": {"index_mode": "x"}}), "upcycling.options.drop", "not in upcycling.methods"),
    (_set("upcycling.options", {"naive": {"index_mode": "x"}}), "upcycling.options.naive.index_mode", "'shared'"),
    (_set("upcycling.options", {"naive": {"r": 0.1}}), "upcycling.options.naive.r", "set r in upcycling.r"),
    (_set("train.lr_search", {"trials": 2, "low": 1e-2, "high": 1e-3, "tokens": 8192}), "train.lr",
     "exactly one of train.lr"),
    (_set("upcycling", {"methods": ["naive", "granular"], "options": {"granular": {"granularity": 4}}}),
     "upcycling.methods[1]", "granular cannot build nano as 4x2: topk=2 is not a multiple of granularity=4"),
    (_set("upcycling", {"methods": ["llama-moe"],
                        "options": {"llama-moe": {"split": "sharing-inter", "n_residual": 1}}}),
     "upcycling.methods[0]", "splits d_ff=128 into n_expert + n_residual = 4 + 1 = 5 equal parts"),
    (_set("train.warmup_tokens", 40960), "tokens.d1[0]", "before warmup ends at step 20"),
    (_set("tokens.d1", [20480, 21000]), "tokens.d1[1]", "rounds to 10 steps"),
    (_set("tokens.d1", [1000, 20480]), "tokens.d1[0]", "less than one step of 2048 tokens"),
    (_set("per_size", {"micro": {"batch_size": 8}}), "per_size.micro", "not a size of this sweep"),
    (_lr_search_and_size_lr, "per_size.nano.lr", "lr_search sets"),
    (_set("per_size", {"nano": {"tokens": {"d1": [4096, 2048]}}}), "per_size.nano.tokens.d1[1]", "sorted ascending"),
    (_set("resources.cpus", 0), "resources.cpus", "greater than or equal to 0.01"),
    # what plans but could never train is refused at its field, naming the bound
    (_set("resources.cpus", 1e-9), "resources.cpus", "greater than or equal to 0.01"),
    (_set("resources.cpus", 1e9), "resources.cpus", "less than or equal to 4096"),
    (_set("model.vocab_size", 2**62), "model.vocab_size", "less than or equal to 4194304"),
    (_set("data.bpe_vocab_size", 2**40), "data.bpe_vocab_size", "less than or equal to 4194304"),
    (_set("data.eval_tokens", 2**63 - 1), "data.eval_tokens", "less than or equal to 1073741824"),
    (_set("train.context", 200000), "train.context", "less than or equal to 131072"),
    (_set("train.batch_size", 2**40), "train.batch_size", "less than or equal to 1048576"),
    (_set("train.lr.moe", 1e300), "train.lr.moe", "less than or equal to 10"),
    (_set("train.lr.dense", -1e-3), "train.lr.dense", "greater than 0"),
    (_set("train.lr_search", {"trials": 2, "low": 1e-3, "high": 1e3, "tokens": 8192}), "train.lr_search.high",
     "above the largest peak LR, 10"),
    (_set("moe", {"experts": [65536], "topk": [1]}), "moe.experts[0]", "less than or equal to 4096"),
    (_set("data.corpus", "/data/" + "**/" * 10 + "*.txt"), "data.corpus", "at most 1 `**` (this one has 10)"),
    (_set("name", "has space"), "name", "should match pattern"),
    (_set("train.context", None), "train.context", "valid integer"),
]


@pytest.mark.parametrize(("mutate", "path", "words"), CASES, ids=[c[1] + ":" + c[2] for c in CASES])
def test_each_problem_has_its_field_path(spec_data: dict, mutate: Callable[[dict], None], path: str,
                                         words: str) -> None:
    mutate(spec_data)
    with pytest.raises(SpecError) as e:
        parse_spec(spec_data)
    assert any(p == path and words in msg for p, msg in e.value.problems), e.value.problems
    assert f"{path}: " in str(e.value)


def test_exact_rounding_refuses_partial_steps(spec_data: dict) -> None:
    spec_data["train"]["round_tokens"] = "exact"
    spec_data["tokens"]["d2"] = [20000]  # 9.77 steps of 2048: 18432 (9 steps) or 20480 (10 steps) would do
    with pytest.raises(SpecError) as e:
        parse_spec(spec_data)
    assert e.value.problems == (("tokens.d2[0]", "nano: 20000 tokens is not a whole number of steps of 2048 "
                                 "(batch_size*context); use 18432 or 20480, or set train.round_tokens: nearest"),)


def test_every_problem_is_reported_at_once(spec_data: dict) -> None:
    spec_data["model"]["sizes"] = ["huge"]
    spec_data["moe"]["topk"] = [8]
    spec_data["upcycling"] = {"methods": ["magic"], "r": [-0.1]}
    spec_data["tokens"] = {"d1": [], "d2": [2, 1]}
    spec_data["train"]["batch_size"] = 0
    with pytest.raises(SpecError) as e:
        parse_spec(spec_data)
    assert [p for p, _ in e.value.problems] == ["model.sizes[0]", "moe.topk[0]", "upcycling.methods[0]",
                                                "upcycling.r[0]", "tokens.d1", "tokens.d2[1]", "train.batch_size"]
    assert str(e.value).startswith("invalid sweep spec (7 problems):\n  model.sizes[0]: unknown size 'huge'")


def test_resources_the_cluster_cannot_provide(spec_data: dict) -> None:
    spec_data["resources"] = {"cpus": 2, "gpus": 1, "workers": 2}
    spec = parse_spec(spec_data)
    check_resources(spec, ClusterResources(cpus=4, gpus=2))  # exactly enough
    with pytest.raises(SpecError) as e:
        check_resources(spec, ClusterResources(cpus=3, gpus=0))
    assert e.value.problems == (
        ("resources.cpus", "a segment needs 4 cpus (2 x 2 workers); the cluster has 3"),
        ("resources.gpus", "a segment needs 2 gpus (1 x 2 workers); the cluster has 0"),
    )


def test_any_file_name_is_read(spec_data: dict, tmp_path: Path) -> None:
    (tmp_path / "sweep.txt").write_text(json.dumps(spec_data))
    assert load_spec(str(tmp_path / "sweep.txt")) == parse_spec(spec_data)


def test_unreadable_sources() -> None:
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec("missing.yaml")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec("name: [unclosed\nmodel: x\n")
    with pytest.raises(SpecError, match="is a mapping"):
        load_spec("- a\n- b\n")


def test_cli_plan_json_and_bad_spec_exit_2(tmp_path: Path) -> None:
    root = Path(__file__).parents[2]
    ok = subprocess.run([str(UPSCALE), "plan", "sweeps/examples/demo.yaml", "--json"], cwd=root, capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    p = plan(load_spec(root / "sweeps/examples/demo.yaml"))
    assert {k: v["count"] for k, v in data["by_kind"].items()} == p.by_kind()
    assert data["saving"] == pytest.approx(p.saving)
    assert len(data["segment_list"]) == len(p.segments) == data["segments"]
    assert 0 < data["estimate"]["serial_s"] < 600  # the demo is sized for 2 CPU cores in under 10 minutes

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: {sizes: [huge]}\nmoe: {experts: [4], topk: [8]}\nupcycling: {methods: [naive]}\n"
                   "tokens: {d1: [2048], d2: [2048]}\ntrain: {context: 128, batch_size: 16, warmup_tokens: 0,"
                   " lr: {dense: 1.0e-3, moe: 1.0e-3}}\n")
    out = subprocess.run([str(UPSCALE), "plan", str(bad)], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = [line.strip() for line in out.stderr.splitlines()]
    assert lines[0] == "error: invalid sweep spec (2 problems):"
    assert lines[1].startswith("model.sizes[0]: unknown size 'huge'") and lines[2].startswith("moe.topk[0]: topk=8")
