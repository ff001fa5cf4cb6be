"""`upscale model init`, `upscale upcycle` and `upscale model expand`: the installed console script
(subprocess, real exit codes) for the happy paths and one bad input; the other bad inputs through the same entry
point in-process (`api.cli.main`, which is what the console script runs), since every subprocess pays ~5 s of torch
import on the shared cores.

Bad input must print one `error: ...` line naming the value and exit 2, never a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

UPSCALE = str(Path(sys.executable).parent / "upscale")


def main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    """Run the console-script entry point in-process; (exit code, stderr)."""
    from upscale.api.cli import main as cli_main

    monkeypatch.setattr(sys, "argv", ["upscale", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli_main()
    return int(exit_info.value.code or 0), capsys.readouterr().err


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([UPSCALE, *args], capture_output=True, text=True, timeout=120,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "dense"
    res = run("model", "init", "--size", "nano", "--seed", "1", "--vocab-size", "256", "--context", "32",
              "--out", str(out))
    assert res.returncode == 0, res.stderr
    return out


def test_upcycle_json_report(dense_dir: Path, tmp_path: Path) -> None:
    res = run("upcycle", "--dense", str(dense_dir), "--method", "drop", "--r", "0.25", "--experts", "4", "--topk",
              "2", "--seed", "3", "--out", str(tmp_path / "moe"), "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert set(report) == {"method", "max_abs_logit_diff", "reinit_fraction", "intact_neuron_fraction",
                           "experts_distinct", "params", "init"}
    assert report["init"]["index_mode"] == "shared"
    assert report["reinit_fraction"] == {"gate": 0.25, "up": 0.25, "down": 0.25}
    assert report["intact_neuron_fraction"] == 0.75 and report["experts_distinct"] is True
    assert set(report["params"]) == {"n1", "n2", "n_total"}
    assert {p.name for p in (tmp_path / "moe").iterdir()} == {"config.json", "weights.pt"}


@pytest.mark.parametrize(("routing", "preserved"), [("softmax_topk", True), ("deepspeed", False)])
def test_naive_top1_upcycle_preserves_the_dense_function(dense_dir: Path, tmp_path: Path, routing: str,
                                                         preserved: bool) -> None:
    res = run("upcycle", "--dense", str(dense_dir), "--method", "naive", "--experts", "4", "--topk", "1",
              "--routing", routing, "--out", str(tmp_path / "moe"), "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["init"]["routing"] == routing
    assert (report["max_abs_logit_diff"] <= 1e-5) is preserved


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "naive", "--experts", "4", "--topk", "5"], "topk=5 is not valid for n_expert=4; valid: 1..4"),
        (["--method", "drop", "--r", "1.5", "--experts", "4", "--topk", "2"], "r: Input should be less than or equal"),
        (["--method", "llama-moe", "--experts", "3", "--topk", "2"], "n_expert=3 equal parts, which does not divide"),
        (["--method", "router-upcycling", "--experts", "4", "--topk", "2"], "needs calibration tokens"),
    ],
)
def test_bad_upcycle_input_exits_2(dense_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture, args: list[str], message: str) -> None:
    code, err = main(monkeypatch, capsys, "upcycle", "--dense", str(dense_dir), "--out", str(tmp_path / "moe"), *args)
    assert code == 2
    assert err.startswith("error: ") and message in " ".join(err.split())
    assert not (tmp_path / "moe").exists()


def test_unknown_method_through_the_console_script(dense_dir: Path, tmp_path: Path) -> None:
    res = run("upcycle", "--dense", str(dense_dir), "--method", "sparse", "--experts", "4", "--topk", "2",
              "--out", str(tmp_path / "moe"))
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and "Traceback" not in res.stderr
    assert "unknown upcycling method 'sparse'; valid methods: naive, drop, noise" in " ".join(res.stderr.split())


def test_unknown_size_and_wrong_shape_checkpoint_exit_2(dense_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    code, err = main(monkeypatch, capsys, "model", "init", "--size", "huge", "--out", str(tmp_path / "x"))
    assert code == 2 and "unknown model size 'huge'; valid sizes: nano" in err
    cfg = json.loads((dense_dir / "config.json").read_text())
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "weights.pt").write_bytes((dense_dir / "weights.pt").read_bytes())
    (broken / "config.json").write_text(json.dumps({**cfg, "d_model": 64, "n_head": 4}))
    code, err = main(monkeypatch, capsys, "upcycle", "--dense", str(broken), "--method", "naive", "--experts", "4",
                     "--topk", "2", "--out", str(tmp_path / "moe"))
    assert code == 2
    assert "tok_emb.weight has shape (256, 32); the config expects (256, 64)" in " ".join(err.split())


def test_out_must_not_overwrite_the_dense_model(dense_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture) -> None:
    before = (dense_dir / "weights.pt").read_bytes()
    code, err = main(monkeypatch, capsys, "upcycle", "--dense", str(dense_dir), "--method", "naive", "--experts", "4",
                     "--topk", "2", "--out", str(dense_dir))
    assert code == 2 and "is the dense model directory" in " ".join(err.split())
    assert (dense_dir / "weights.pt").read_bytes() == before


def test_expand_keeps_a_top1_parent_and_names_bad_input(dense_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    parent = tmp_path / "moe4"
    assert main(monkeypatch, capsys, "upcycle", "--dense", str(dense_dir), "--method", "drop", "--experts", "4",
                "--topk", "1", "--out", str(parent))[0] == 0
    res = run("model", "expand", "--parent", str(parent), "--factor", "2", "--bias-noise", "0", "--out",
              str(tmp_path / "moe8"), "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["n_expert"] == [4, 8] and report["topk"] == [1, 1]
    assert report["max_abs_logit_diff"] <= 1e-5  # top-1 with weight 1: the parent's function (docs/methods.md)
    assert report["params"]["n_total"][1] > report["params"]["n_total"][0]
    for args, message in [
        (("--parent", str(parent), "--factor", "1"), "factor: Input should be greater than or equal to 2"),
        (("--parent", str(dense_dir), "--factor", "2"), "parent n_expert=0"),
        (("--parent", str(parent), "--factor", "2", "--strategy", "utility"), "needs calibration tokens"),
    ]:
        code, err = main(monkeypatch, capsys, "model", "expand", *args, "--out", str(tmp_path / "bad"))
        assert code == 2 and message in " ".join(err.split()), err
    assert not (tmp_path / "bad").exists()


def test_model_init_explicit_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture) -> None:
    from upscale.workers.weights import load_model

    code, _ = main(monkeypatch, capsys, "model", "init", "--n-layer", "1", "--d-model", "16", "--n-head", "2",
                   "--vocab-size", "32", "--out", str(tmp_path / "m"))
    assert code == 0
    cfg, sd = load_model(tmp_path / "m")
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.vocab_size) == (1, 16, 2, 32)
    assert sd["blocks.0.ffn.w_up.weight"].shape == (64, 16)
    code, err = main(monkeypatch, capsys, "model", "init", "--size", "nano", "--d-model", "16", "--out",
                     str(tmp_path / "x"))
    assert code == 2 and "give either --size or all of --n-layer, --d-model and --n-head" in err
    code, err = main(monkeypatch, capsys, "model", "init", "--n-layer", "1", "--d-model", "16", "--n-head", "3",
                     "--out", str(tmp_path / "x"))
    assert code == 2 and "d_model=16 is not divisible by n_head=3" in err


def test_hf_import_and_export_through_the_console_script(tmp_path: Path) -> None:
    from tests.workers.test_hf_models import hf_llama

    src = hf_llama(tmp_path / "hf", tied=True)
    res = run("model", "import", "--hf", str(src), "--out", str(tmp_path / "dense"), "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["architecture"] == "LlamaForCausalLM" and report["shape"]["n_kv_head"] == 2
    assert {p.name for p in (tmp_path / "dense").iterdir()} == {"config.json", "weights.pt", "source.json"}
    res = run("model", "export", str(tmp_path / "dense"), "--format", "hf", "--out", str(tmp_path / "out"), "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert set(report) == {"format", "architecture", "routing_change", "max_abs_logit_diff", "files", "out"}
    assert report["max_abs_logit_diff"] < 1e-4 and "model.safetensors" in report["files"]


def test_hf_bad_input_is_one_error_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                        tmp_path: Path, dense_dir: Path) -> None:
    from tests.workers.test_hf_models import hf_llama

    src = hf_llama(tmp_path / "hf")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "mlp_bias": True}))
    capsys.readouterr()  # transformers' save progress bar is not the command's output
    cases = [
        (("model", "import", "--hf", str(src), "--out", str(tmp_path / "a")), "mlp_bias=True is not supported"),
        (("model", "import", "--hf", "meta-llama/Llama-3.2-1B", "--out", str(tmp_path / "a")), "download it first"),
        (("model", "export", str(dense_dir), "--format", "onnx", "--out", str(tmp_path / "a")), "valid: hf"),
        (("model", "export", str(tmp_path), "--out", str(tmp_path / "a")), "config.json is missing"),
    ]
    for args, message in cases:
        code, err = main(monkeypatch, capsys, *args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], err
        assert not (tmp_path / "a").exists()
