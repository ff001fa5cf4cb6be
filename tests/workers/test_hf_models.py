"""Hugging Face models in and out: tiny random `transformers` Llama checkpoints built here (no hub), imported with
equal logits, upcycled, exported as Llama / Mixtral / Qwen2-MoE and loaded back with `AutoModelForCausalLM`; the
routing refusal; bad checkpoints refused with the file and field, nothing written to --out.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.hf_data import VOCAB, hf_llama
from upscale.sweeps.segments import ExpandSpec
from upscale.workers.errors import WorkerError
from upscale.workers.hf_models import SOURCE_FILE, export_hf, import_hf, sha256_of_files
from upscale.workers.upcycling import expand, method_spec, upcycle
from upscale.workers.weights import instantiate, load_model, save_model

REL_TOL = 1e-5


def hf_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


def upscale_logits(model_dir: Path, tokens: torch.Tensor) -> torch.Tensor:
    cfg, sd = load_model(model_dir)
    with torch.no_grad():
        return instantiate(cfg, sd).eval()(tokens)[0]


def assert_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    rel = float((ours - theirs).abs().max() / theirs.abs().max())
    assert rel <= REL_TOL, rel


TOKENS = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(1))
CALIBRATION = torch.randint(0, VOCAB, (16, 32), generator=torch.Generator().manual_seed(2))


def upcycled(dense: Path, method: str, options: dict, **moe: object) -> tuple:
    """(config, state dict) of the imported dense model at `dense` upcycled by `method` into the MoE of `moe`."""
    dense_cfg, dense_sd = load_model(dense)
    return upcycle(dense_sd, dense_cfg.updated(**moe), method_spec(method, **options), calibration_tokens=CALIBRATION)


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the HF dense folder, its upscale import)."""
    root = tmp_path_factory.mktemp("hf")
    src = hf_llama(root / "hf")
    import_hf(src, root / "dense")
    return src, root / "dense"


@pytest.mark.parametrize(("tied", "shard"), [(False, False), (True, True), (False, True)])
def test_import_gives_equal_logits(tmp_path: Path, tied: bool, shard: bool) -> None:
    src = hf_llama(tmp_path / "hf", tied=tied, shard=shard)
    assert (src / "model.safetensors.index.json").is_file() == shard
    report = import_hf(src, tmp_path / "up")
    assert report["shape"] == {"n_layer": 2, "d_model": 32, "n_head": 4, "ffn_width": 72, "n_kv_head": 2}
    assert (report["tie_embeddings"], report["norm_eps"], report["rope_theta"]) == (tied, 1e-6, 500.0)
    assert_close(upscale_logits(tmp_path / "up", TOKENS), hf_logits(src, TOKENS))
    source = json.loads((tmp_path / "up" / SOURCE_FILE).read_text())
    weights = sorted(src.glob("*.safetensors"))
    assert source["source_sha256"] == sha256_of_files(weights) == report["source_sha256"]
    assert source["weights_sha256"] == sha256_of_files([tmp_path / "up" / "weights.pt"])
    assert source["config"]["model_type"] == "llama" and source["path"] == str(src.resolve())


def test_naive_upcycle_exported_as_mixtral_is_the_original_dense_function(imported: tuple[Path, Path],
                                                                          tmp_path: Path) -> None:
    src, dense = imported
    dense_cfg, dense_sd = load_model(dense)
    cfg, moe_sd = upcycle(dense_sd, dense_cfg.updated(n_expert=8, topk=2), method_spec("naive"))
    save_model(tmp_path / "moe", cfg, moe_sd)
    report = export_hf(tmp_path / "moe", tmp_path / "hf_moe")
    assert report["architecture"] == "MixtralForCausalLM" and report["routing_change"] is None
    assert {"config.json", "generation_config.json", "model.safetensors"} <= set(report["files"])
    config = json.loads((tmp_path / "hf_moe" / "config.json").read_text())
    assert (config["model_type"], config["num_local_experts"], config["num_experts_per_tok"]) == ("mixtral", 8, 2)
    # function preservation end to end: transformers' Mixtral computes what the original transformers Llama did
    assert_close(hf_logits(tmp_path / "hf_moe", TOKENS), hf_logits(src, TOKENS))


@pytest.mark.parametrize(("method", "options", "arch"), [
    ("drop", {"r": 0.5}, "MixtralForCausalLM"),
    ("granular", {"granularity": 2}, "MixtralForCausalLM"),
    ("router-upcycling", {}, "MixtralForCausalLM"),
    ("llama-moe", {"split": "sharing-inter", "llama_gate": "linear", "n_residual": 1}, "Qwen2MoeForCausalLM"),
    ("llama-moe", {"split": "independent-random", "llama_gate": "linear"}, "MixtralForCausalLM"),
])
def test_moe_exports_load_and_match_upscale(imported: tuple[Path, Path], tmp_path: Path, method: str,
                                           options: dict, arch: str) -> None:
    cfg, moe_sd = upcycled(imported[1], method, options, n_expert=8, topk=2)
    save_model(tmp_path / "moe", cfg, moe_sd)
    report = export_hf(tmp_path / "moe", tmp_path / "hf_moe")
    assert report["architecture"] == arch
    ours, theirs = upscale_logits(tmp_path / "moe", TOKENS), hf_logits(tmp_path / "hf_moe", TOKENS)
    assert_close(ours, theirs)
    assert report["max_abs_logit_diff"] <= REL_TOL * float(theirs.abs().max())
    config = json.loads((tmp_path / "hf_moe" / "config.json").read_text())
    # widths off transformers' grouped-matmul alignment (72/8 = 9) load with its eager experts
    assert config.get("experts_implementation") == ("eager" if cfg.d_expert % 8 else None)
    if arch == "Qwen2MoeForCausalLM":
        assert config["shared_expert_intermediate_size"] == cfg.shared_d_ff == 8
        assert config["moe_intermediate_size"] == cfg.d_expert == 8 and config["norm_topk_prob"] is True


@pytest.mark.parametrize(("method", "options", "arch"), [
    ("drop", {"r": 0.5}, "MixtralForCausalLM"),
    ("llama-moe", {"split": "sharing-inter", "llama_gate": "linear", "n_residual": 2}, "Qwen2MoeForCausalLM"),
])
def test_expanded_moe_exports_with_equal_logits(imported: tuple[Path, Path], tmp_path: Path, method: str,
                                               options: dict, arch: str) -> None:
    parent_cfg, parent_sd = upcycled(imported[1], method, options, n_expert=4, topk=2)
    cfg, sd = expand(parent_sd, parent_cfg, ExpandSpec(factor=2, r=0.25))
    save_model(tmp_path / "moe", cfg, sd)
    report = export_hf(tmp_path / "moe", tmp_path / "hf_moe")
    assert report["architecture"] == arch and report["routing_change"] is None
    config = json.loads((tmp_path / "hf_moe" / "config.json").read_text())
    assert config.get("num_local_experts", config.get("num_experts")) == 8 and config["num_experts_per_tok"] == 2
    assert_close(upscale_logits(tmp_path / "moe", TOKENS), hf_logits(tmp_path / "hf_moe", TOKENS))


def test_loss_free_bias_is_left_out_only_when_allowed(imported: tuple[Path, Path], tmp_path: Path) -> None:
    parent_cfg, parent_sd = upcycled(imported[1], "drop", {}, n_expert=4, topk=2, balancing="loss_free")
    cfg, sd = expand(parent_sd, parent_cfg, ExpandSpec(factor=2))
    save_model(tmp_path / "zero", cfg, sd)  # a zero bias (a fresh upcycle's) chooses nothing: exported exactly
    assert export_hf(tmp_path / "zero", tmp_path / "hf_zero")["routing_change"] is None
    assert_close(upscale_logits(tmp_path / "zero", TOKENS), hf_logits(tmp_path / "hf_zero", TOKENS))
    for l in range(cfg.n_layer):
        sd[f"blocks.{l}.ffn.moe.deepspeed_moe.gate.route_bias"] = torch.linspace(-0.3, 0.3, cfg.n_expert)
    save_model(tmp_path / "biased", cfg, sd)
    with pytest.raises(WorkerError, match=r"loss-free balancing's bias \(nonzero in layers \[0, 1\]\)"):
        export_hf(tmp_path / "biased", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    report = export_hf(tmp_path / "biased", tmp_path / "out", allow_routing_change=True)
    assert report["max_abs_logit_diff"] > 1e-3  # the bias really chose other experts, and the report says so


def test_dense_export_is_llama_with_tied_embeddings_and_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    src = hf_llama(tmp_path / "hf", tied=True)
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB - 1)} | {"[UNK]": VOCAB - 1}, unk_token="[UNK]")) \
        .save(str(src / "tokenizer.json"))
    assert import_hf(src, tmp_path / "up")["tokenizer"] == "tokenizer"
    report = export_hf(tmp_path / "up", tmp_path / "out")
    assert report["architecture"] == "LlamaForCausalLM" and "tokenizer.json" in report["files"]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is True
    assert_close(hf_logits(tmp_path / "out", TOKENS), hf_logits(src, TOKENS))


def test_deepspeed_top1_routing_is_refused_unless_allowed(imported: tuple[Path, Path], tmp_path: Path) -> None:
    _, dense = imported
    dense_cfg, dense_sd = load_model(dense)
    cfg, moe_sd = upcycle(dense_sd, dense_cfg.updated(n_expert=4, topk=1, routing="deepspeed"), method_spec("drop"))
    save_model(tmp_path / "moe", cfg, moe_sd)
    with pytest.raises(WorkerError, match=r"top-1 with DeepSpeed's weighting.*--allow-routing-change"):
        export_hf(tmp_path / "moe", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    report = export_hf(tmp_path / "moe", tmp_path / "out", allow_routing_change=True)
    assert report["architecture"] == "MixtralForCausalLM" and "DeepSpeed" in report["routing_change"]
    assert report["max_abs_logit_diff"] > 1e-3  # the routing really differs, and the report measures it


def test_mlp_router_is_refused(imported: tuple[Path, Path], tmp_path: Path) -> None:
    _, dense = imported
    dense_cfg, dense_sd = load_model(dense)
    cfg, moe_sd = upcycle(dense_sd, dense_cfg.updated(n_expert=4, topk=2), method_spec("llama-moe"))
    save_model(tmp_path / "moe", cfg, moe_sd)
    with pytest.raises(WorkerError, match=r"tanh-MLP router.*--gate linear"):
        export_hf(tmp_path / "moe", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize(("breakage", "message"), [
    (lambda d: _edit_config(d, model_type="mistral"), r"config.json: model_type='mistral' is not supported"),
    (lambda d: _edit_config(d, architectures=["LlamaForSequenceClassification"]), r"config.json: architectures="),
    (lambda d: _edit_config(d, attention_bias=True), r"config.json: attention_bias=True is not supported"),
    (lambda d: _edit_config(d, hidden_act="gelu"), r"config.json: hidden_act='gelu' is not supported"),
    (lambda d: _edit_config(d, head_dim=16), r"config.json: head_dim=16 is not supported"),
    (lambda d: _edit_config(d, rope_scaling={"rope_type": "linear", "factor": 2.0}), r"config.json: rope_scaling="),
    (lambda d: _edit_config(d, intermediate_size=80), r"tensor model.layers.0.mlp.gate_proj.weight has shape "
                                                       r"\(72, 32\); config.json implies \(80, 32\)"),
    (lambda d: _edit_config(d, num_hidden_layers=3), r"tensor model.layers.2.\S+ is missing"),
    (lambda d: _edit_config(d, num_key_value_heads=3), r"config.json: .*n_kv_head=3 does not divide n_head=4"),
    (lambda d: (d / "model-00002-of-00007.safetensors").unlink(),
     r"index.json: weight_map names shard model-00002-of-00007.safetensors, which is missing"),
    (lambda d: (d / "config.json").unlink(), r"config.json: missing"),
])
def test_bad_checkpoints_are_refused_and_nothing_is_written(tmp_path: Path, breakage, message: str) -> None:
    src = hf_llama(tmp_path / "hf", shard=True)
    assert len(list(src.glob("*.safetensors"))) == 7  # the missing-shard case names the second of seven
    breakage(src)
    with pytest.raises(WorkerError, match=message):
        import_hf(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no staging folder left behind


def test_bias_tensors_and_wrong_tokenizers_are_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer, models

    src = hf_llama(tmp_path / "hf")
    tensors = load_file(src / "model.safetensors")
    save_file({**tensors, "model.layers.0.self_attn.q_proj.bias": torch.zeros(32)}, src / "model.safetensors")
    with pytest.raises(WorkerError, match=r"model.safetensors: tensor model.layers.0.self_attn.q_proj.bias is not"):
        import_hf(src, tmp_path / "out")
    save_file(tensors, src / "model.safetensors")
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB + 4)}, unk_token="w0")) \
        .save(str(tmp_path / "tokenizer.json"))
    import_hf(src, tmp_path / "up")
    with pytest.raises(WorkerError, match=rf"tokenizer.json: the tokenizer has {VOCAB + 4} tokens; the model's "
                                          rf"vocab_size is {VOCAB}"):
        export_hf(tmp_path / "up", tmp_path / "out", tokenizer=tmp_path / "tokenizer.json")
    assert not (tmp_path / "out").exists()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep")
    with pytest.raises(WorkerError, match="already exists and is not empty"):
        export_hf(tmp_path / "up", tmp_path / "taken")
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["x"]
