"""Hugging Face checkpoints in and out: a local `transformers` Llama folder becomes an upscale model directory
(`import_hf`), and an upscale model, dense or MoE, becomes a stock `transformers` architecture (`export_hf`).

Import reads config.json as JSON (resolved by `LlamaConfig` for its defaults) and the safetensors shards one tensor at
a time, never instantiating the Hugging Face model, so a checkpoint needs its own size in memory once, not twice. What
upscale's decoder cannot compute (biases, rope scaling, another head size or activation, sliding windows) is refused
with the file and field. The weights' sha256 and the source config are recorded in `source.json` beside the model.

Export writes the model as the Hugging Face architecture that computes the same function (docs/methods.md, "Hugging
Face import and export"): dense -> `LlamaForCausalLM`; routed experts with a linear router (a mixture router is one:
its effective matrix is exact) -> `MixtralForCausalLM`; with an always-on shared expert -> `Qwen2MoeForCausalLM`, whose
shared expert is scaled by sigmoid(gate·x): a zero gate gives 1/2, so the shared down projection is written doubled.
The result is loaded back with `AutoModelForCausalLM` and its logits compared with upscale's on a probe batch.
Files are written into a temporary sibling of --out and renamed at the end: a refused or failed export writes
nothing there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from upscale.sweeps.data_sources import TOKENIZER_FILES, tokenizer_files
from upscale.sweeps.model_dirs import (  # provenance of an imported model: HF folder, config, sha256
    SOURCE_FILE,
    read_json_object,
)
from upscale.workers.errors import WorkerError, validated
from upscale.workers.model import MixtureRouter, ModelConfig
from upscale.workers.upcycling.adapter import bias_of, experts_of, router_of, shared_of
from upscale.workers.weights import WEIGHTS_FILE, expected_shapes, instantiate, load_model, save_model

TOKENIZER_DIR = "tokenizer"  # an imported model keeps its tokenizer files here
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
GROUPED_MM_ALIGN = 8  # widths transformers' grouped-matmul experts accept: 16-byte rows in bf16
PROBE_SHAPE = (2, 32)  # the probe batch of an export: 2 sequences of up to 32 tokens


def sha256_of_files(paths: list[Path]) -> str:
    """One sha256 over the files' bytes in the order given (names excluded: the same weights anywhere, one value)."""
    h = hashlib.sha256()
    for p in paths:
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


# -- import -------------------------------------------------------------------------------------------------------


def import_hf(src: Path, out: Path) -> dict[str, Any]:
    """Write the upscale model directory of the `LlamaForCausalLM` checkpoint folder `src` to `out`; the report."""
    src = _local_folder(src, "--hf")
    _check_out(out)
    cfg_file = src / "config.json"
    raw = _read_json(cfg_file)
    cfg = _llama_to_config(raw, cfg_file)
    files, where = _weight_files(src)
    state_dict = _read_llama_tensors(cfg, files, where)
    with _staging(out) as tmp:
        save_model(tmp, cfg, state_dict)
        tokenizer = _copy_tokenizer(src, tmp / TOKENIZER_DIR, cfg.vocab_size, required=False)
        source = {
            "format": "huggingface", "architecture": "LlamaForCausalLM", "path": str(src), "config": raw,
            "weight_files": [f.name for f in files], "source_sha256": sha256_of_files(files),
            "weights_sha256": sha256_of_files([tmp / WEIGHTS_FILE]),
            "tokenizer": TOKENIZER_DIR if tokenizer else None,
        }
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    return {
        "source": str(src), "out": str(out), "architecture": "LlamaForCausalLM",
        "shape": cfg.shape.model_dump(), "vocab_size": cfg.vocab_size, "context": cfg.context,
        "tie_embeddings": cfg.tie_embeddings, "norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "params": {"n1": _n1(cfg)}, "source_sha256": source["source_sha256"],
        "weights_sha256": source["weights_sha256"], "tokenizer": source["tokenizer"],
    }


def _n1(cfg: ModelConfig) -> int:
    from upscale.sweeps import sizes

    return sizes.dense_params(cfg.shape)


def _local_folder(path: Path, option: str) -> Path:
    if not path.exists():
        hint = " (a hub id? download it first, e.g. `hf download ID --local-dir DIR`, and pass DIR)" \
            if "/" in str(path) and not str(path).startswith(("/", ".")) else ""
        raise WorkerError(f"{option} {path}: no such local folder{hint}")
    if not path.is_dir():
        raise WorkerError(f"{option} {path} is not a folder")
    return path.resolve()


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise WorkerError(f"--out {out} already exists and is not empty; choose a new directory")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise WorkerError(f"{path}: missing (a Hugging Face model folder holds config.json beside its weights)")
    return read_json_object(path, WorkerError)


def _llama_to_config(raw: dict[str, Any], cfg_file: Path) -> ModelConfig:
    """The upscale ModelConfig of a Llama config.json; a WorkerError naming the field upscale cannot compute."""
    from transformers import LlamaConfig

    model_type = raw.get("model_type")
    if model_type != "llama":
        raise WorkerError(f"{cfg_file}: model_type={model_type!r} is not supported; upscale imports llama "
                          f"(LlamaForCausalLM) checkpoints")
    archs = raw.get("architectures")
    if archs is not None and archs != ["LlamaForCausalLM"]:
        raise WorkerError(f"{cfg_file}: architectures={archs!r}; upscale imports LlamaForCausalLM checkpoints")
    for field in ("rope_scaling", "sliding_window"):
        if raw.get(field) is not None:
            raise WorkerError(f"{cfg_file}: {field}={raw[field]!r} is not supported (upscale's decoder has plain RoPE "
                              f"and full causal attention)")
    try:
        hf = LlamaConfig.from_dict(raw)
    except Exception as e:  # transformers' strict config validation raises several types
        raise WorkerError(f"{cfg_file}: not a valid Llama config ({e})") from None
    refusals = {
        "attention_bias": (hf.attention_bias, False), "mlp_bias": (hf.mlp_bias, False),
        "hidden_act": (hf.hidden_act, "silu"),
        "head_dim": (hf.head_dim, hf.hidden_size // hf.num_attention_heads),
        "rope_parameters.rope_type": ((hf.rope_parameters or {}).get("rope_type", "default"), "default"),
    }
    for field, (got, want) in refusals.items():
        if got != want:
            raise WorkerError(f"{cfg_file}: {field}={got!r} is not supported; upscale's Llama needs {field}={want!r}")
    theta = (hf.rope_parameters or {}).get("rope_theta", 10000.0)
    try:
        return validated(
            ModelConfig, n_layer=hf.num_hidden_layers, d_model=hf.hidden_size, n_head=hf.num_attention_heads,
            n_kv_head=hf.num_key_value_heads, ffn_width=hf.intermediate_size, vocab_size=hf.vocab_size,
            context=hf.max_position_embeddings, tie_embeddings=bool(hf.tie_word_embeddings), norm_eps=hf.rms_norm_eps,
            rope_theta=float(theta), init_std=hf.initializer_range or 0.02,
        )
    except WorkerError as e:
        raise WorkerError(f"{cfg_file}: {e}") from None


def _weight_files(src: Path) -> tuple[list[Path], dict[str, Path]]:
    """(the safetensors files, tensor name -> its file) of a single-file or sharded checkpoint."""
    from safetensors import safe_open

    index = src / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise WorkerError(f"{index}: weight_map is missing or empty")
        where = {name: src / shard for name, shard in weight_map.items()}
        files = sorted(set(where.values()))
        for f in files:
            if not f.is_file():
                raise WorkerError(f"{index}: weight_map names shard {f.name}, which is missing from {src}")
        return files, where
    single = src / SAFETENSORS_FILE
    if not single.is_file():
        raise WorkerError(f"{src}: no {SAFETENSORS_FILE} or {SAFETENSORS_INDEX} (save the model with "
                          f"save_pretrained(..., safe_serialization=True))")
    try:
        with safe_open(single, "pt") as f:
            names = list(f.keys())
    except Exception as e:  # safetensors raises its own error type for a corrupt header
        raise WorkerError(f"{single}: not a readable safetensors file ({e})") from None
    return [single], dict.fromkeys(names, single)


def _llama_names(cfg: ModelConfig) -> dict[str, str]:
    """upscale state-dict name -> the LlamaForCausalLM tensor name."""
    names = {"tok_emb.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
    for l in range(cfg.n_layer):
        hf, up = f"model.layers.{l}", f"blocks.{l}"
        names |= {f"{up}.attn_norm.weight": f"{hf}.input_layernorm.weight",
                  f"{up}.ffn_norm.weight": f"{hf}.post_attention_layernorm.weight"}
        names |= {f"{up}.attn.w{p}.weight": f"{hf}.self_attn.{p}_proj.weight" for p in "qkvo"}
        names |= {f"{up}.ffn.w_{p}.weight": f"{hf}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    return names


def _read_llama_tensors(cfg: ModelConfig, files: list[Path], where: dict[str, Path]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    names = _llama_names(cfg)
    if cfg.tie_embeddings:
        names.pop("lm_head.weight")  # tied: the head is the embedding, whether or not the file repeats it
    known = set(names.values()) | {"lm_head.weight"}
    for hf_name in sorted(where):
        if hf_name not in known and not hf_name.endswith("rotary_emb.inv_freq"):  # old files keep RoPE's buffer
            raise WorkerError(f"{where[hf_name]}: tensor {hf_name} is not a weight of the LlamaForCausalLM that "
                              f"config.json describes (n_layer={cfg.n_layer}, no biases)")
    expected = expected_shapes(cfg)
    state_dict: dict[str, torch.Tensor] = {}
    handles = {}
    try:
        for up_name, hf_name in names.items():
            f = where.get(hf_name)
            if f is None:
                raise WorkerError(f"{files[0].parent}: tensor {hf_name} is missing from the checkpoint")
            if f not in handles:
                handles[f] = safe_open(f, "pt")
            try:
                t = handles[f].get_tensor(hf_name)
            except Exception as e:  # the index names a tensor the shard does not hold
                raise WorkerError(f"{f}: tensor {hf_name} cannot be read ({e})") from None
            if tuple(t.shape) != expected[up_name]:
                raise WorkerError(f"{f}: tensor {hf_name} has shape {tuple(t.shape)}; config.json implies "
                                  f"{expected[up_name]}")
            state_dict[up_name] = t.float()
    finally:
        handles.clear()
    if cfg.tie_embeddings:
        state_dict["lm_head.weight"] = state_dict["tok_emb.weight"]
    return state_dict


# -- export -------------------------------------------------------------------------------------------------------


def export_hf(model_dir: Path, out: Path, *, allow_routing_change: bool = False,
              tokenizer: Path | None = None) -> dict[str, Any]:
    """Write the upscale model at `model_dir` as a `transformers` model folder `out`; the export report."""
    cfg, state_dict = load_model(model_dir)
    if out.resolve() == Path(model_dir).resolve():
        raise WorkerError(f"--out {out} is the model directory; write the export somewhere else")
    _check_out(out)
    architecture, routing_change = _target(cfg)
    routing_change = "; ".join(c for c in (routing_change, _bias_change(cfg, state_dict)) if c) or None
    if routing_change and not allow_routing_change:
        raise WorkerError(f"{model_dir}: {routing_change}; pass --allow-routing-change to export it anyway")
    hf_config = _hf_config(cfg, architecture)
    tensors = _hf_tensors(cfg, state_dict, architecture)
    tokenizer_src = tokenizer if tokenizer is not None else _recorded_tokenizer(Path(model_dir))
    if tokenizer is not None and not tokenizer.exists():
        raise WorkerError(f"--tokenizer {tokenizer}: no such file or folder")
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    with _staging(out) as tmp:
        hf_config.save_pretrained(tmp)
        if cfg.is_moe and (cfg.d_expert % GROUPED_MM_ALIGN or cfg.d_model % GROUPED_MM_ALIGN):
            # transformers' default grouped-matmul experts need rows aligned to 16 bytes (8 bf16 values) and fail
            # on other widths; the eager experts compute the same sums for any width
            config_file = tmp / "config.json"
            config_file.write_text(json.dumps({**json.loads(config_file.read_text()),
                                               "experts_implementation": "eager"}, indent=2) + "\n")
        GenerationConfig.from_model_config(hf_config).save_pretrained(tmp)
        save_file(tensors, str(tmp / SAFETENSORS_FILE), metadata={"format": "pt"})
        if tokenizer_src is not None:
            _copy_tokenizer(tokenizer_src, tmp, cfg.vocab_size, required=True)
        diff = _probe_diff(cfg, state_dict, tmp)
        files = sorted(p.name for p in tmp.iterdir())
    return {
        "format": "hf", "architecture": architecture, "routing_change": routing_change,
        "max_abs_logit_diff": diff, "files": files, "out": str(out),
    }


def _target(cfg: ModelConfig) -> tuple[str, str | None]:
    """(the transformers architecture holding `cfg`, how its routing differs from upscale's or None)."""
    if not cfg.is_moe:
        return "LlamaForCausalLM", None
    if cfg.router_type == "mlp":
        raise WorkerError("the tanh-MLP router (llama-moe's default gate) is not linear in the hidden state, and "
                          "every stock transformers MoE routes with one linear layer; upcycle with --gate linear to "
                          "export")
    if cfg.shared_d_ff:
        # Qwen2-MoE weights the top-k by their softmax probability unless norm_topk_prob renormalises them: both
        # of upscale's routings are one of the two
        return "Qwen2MoeForCausalLM", None
    if cfg.topk == 1 and cfg.routing == "deepspeed":
        return "MixtralForCausalLM", ("upscale routes top-1 with DeepSpeed's weighting (the chosen expert's output "
                                      "times its softmax probability); Mixtral renormalises the top-k, so its top-1 "
                                      "weight is 1")
    return "MixtralForCausalLM", None


def _bias_change(cfg: ModelConfig, state_dict: dict[str, torch.Tensor]) -> str | None:
    """How dropping loss-free balancing's routing bias changes the routing, or None where it is zero everywhere.
    The bias moves only the choice of experts, so it cannot be folded into a linear router's weights, and Mixtral and
    Qwen2-MoE have no selection bias: a nonzero one is left out, and the report measures what that changes."""
    if cfg.balancing != "loss_free":
        return None
    layers = [l for l in range(cfg.n_layer) if bool((bias_of(state_dict, l) != 0).any())]
    if not layers:
        return None
    return (f"upscale picks experts on the routing scores plus loss-free balancing's bias (nonzero in layers "
            f"{layers}); Mixtral and Qwen2-MoE have no such bias, so the export routes without it")


def _hf_config(cfg: ModelConfig, architecture: str) -> Any:
    common: dict[str, Any] = {
        "architectures": [architecture], "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads,
        "max_position_embeddings": cfg.context, "rms_norm_eps": cfg.norm_eps, "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_embeddings, "initializer_range": cfg.init_std,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "dtype": "float32",
    }
    if architecture == "LlamaForCausalLM":
        from transformers import LlamaConfig

        return LlamaConfig(**common, intermediate_size=cfg.d_ff, head_dim=cfg.d_model // cfg.n_head,
                           attention_bias=False, mlp_bias=False)
    moe = {"num_experts_per_tok": cfg.topk, "router_aux_loss_coef": cfg.aux_loss_coef, "output_router_logits": False}
    if architecture == "MixtralForCausalLM":
        from transformers import MixtralConfig

        return MixtralConfig(**common, **moe, intermediate_size=cfg.d_expert, num_local_experts=cfg.n_expert,
                             head_dim=cfg.d_model // cfg.n_head, sliding_window=None)
    from transformers import Qwen2MoeConfig

    # norm_topk_prob renormalises the top-k: upscale's softmax_topk (and DeepSpeed's k >= 2); without it the top-k
    # keep their softmax probabilities, DeepSpeed's top-1
    renormalise = not (cfg.topk == 1 and cfg.routing == "deepspeed")
    return Qwen2MoeConfig(**common, **moe, intermediate_size=cfg.d_ff, moe_intermediate_size=cfg.d_expert,
                          shared_expert_intermediate_size=cfg.shared_d_ff, num_experts=cfg.n_expert,
                          norm_topk_prob=renormalise, decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=False,
                          use_sliding_window=False)


def _linear_router(cfg: ModelConfig, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """The router as one [n_expert, d_model] matrix (exact for linear and mixture routers)."""
    if cfg.router_type == "linear":
        return params["weight"].float()
    mixture = MixtureRouter(cfg.d_model, cfg.n_expert, cfg.routers)
    mixture.load_state_dict(params)
    return mixture.weight.detach().float()


def _hf_tensors(cfg: ModelConfig, sd: dict[str, torch.Tensor], architecture: str) -> dict[str, torch.Tensor]:
    """The safetensors dict of the export, named as `save_pretrained` of that architecture names them."""
    out: dict[str, torch.Tensor] = {}
    for up_name, hf_name in _llama_names(cfg).items():
        if (".ffn." in up_name and cfg.is_moe) or (up_name == "lm_head.weight" and cfg.tie_embeddings):
            continue
        out[hf_name] = sd[up_name]
    for l in range(cfg.n_layer if cfg.is_moe else 0):
        hf = f"model.layers.{l}"
        router = _linear_router(cfg, router_of(sd, l))
        experts = experts_of(sd, cfg, l)
        if architecture == "MixtralForCausalLM":
            out[f"{hf}.block_sparse_moe.gate.weight"] = router
            for e, (g, u, d) in enumerate(experts):
                # Mixtral's w1 is the gate projection, w3 the up projection, w2 the down projection
                out |= {f"{hf}.block_sparse_moe.experts.{e}.w1.weight": g,
                        f"{hf}.block_sparse_moe.experts.{e}.w3.weight": u,
                        f"{hf}.block_sparse_moe.experts.{e}.w2.weight": d}
            continue
        out[f"{hf}.mlp.gate.weight"] = router
        for e, (g, u, d) in enumerate(experts):
            out |= {f"{hf}.mlp.experts.{e}.gate_proj.weight": g, f"{hf}.mlp.experts.{e}.up_proj.weight": u,
                    f"{hf}.mlp.experts.{e}.down_proj.weight": d}
        shared = shared_of(sd, l)
        assert shared is not None
        g, u, d = shared
        out |= {f"{hf}.mlp.shared_expert.gate_proj.weight": g, f"{hf}.mlp.shared_expert.up_proj.weight": u,
                # sigmoid(0) = 1/2 scales the shared expert; doubling its output projection is exact in binary
                f"{hf}.mlp.shared_expert.down_proj.weight": d * 2,
                f"{hf}.mlp.shared_expert_gate.weight": torch.zeros(1, cfg.d_model)}
    return {k: v.detach().float().contiguous() for k, v in out.items()}


def _probe_diff(cfg: ModelConfig, state_dict: dict[str, torch.Tensor], folder: Path) -> float:
    """max |upscale - transformers| logit (fp32) on a fixed random batch, the export loaded as a user would."""
    from transformers import AutoModelForCausalLM

    batch, length = PROBE_SHAPE
    tokens = torch.randint(0, cfg.vocab_size, (batch, min(length, cfg.context)),
                           generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = instantiate(cfg, state_dict).eval()(tokens)[0]
        theirs = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
        return float((ours - theirs(tokens).logits).abs().max())


# -- tokenizer and staging ----------------------------------------------------------------------------------------


def _recorded_tokenizer(model_dir: Path) -> Path | None:
    """The tokenizer an import recorded beside the model (source.json), if any."""
    source = model_dir / SOURCE_FILE
    if not source.is_file():
        return None
    recorded = _read_json(source).get("tokenizer")
    return model_dir / recorded if recorded else None


def _copy_tokenizer(src: Path, dest: Path, vocab_size: int, *, required: bool) -> bool:
    """Copy a tokenizer (a folder of tokenizer files, or one tokenizer.json) into `dest`; False when `src` holds
    none and none is required. A tokenizer with more tokens than the model's vocabulary is refused."""
    files = tokenizer_files(src)
    if not files:
        if required:
            raise WorkerError(f"--tokenizer {src}: no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...) in it")
        return False
    tokenizer_json = next((f for f in files if f.suffix == ".json" and f.name.startswith("tokenizer")
                           and f.name != "tokenizer_config.json"), None)
    if tokenizer_json is not None:
        from tokenizers import Tokenizer

        try:
            size = Tokenizer.from_file(str(tokenizer_json)).get_vocab_size(with_added_tokens=True)
        except Exception as e:  # tokenizers raises a bare Exception for a malformed file
            raise WorkerError(f"{tokenizer_json}: not a readable tokenizer ({e})") from None
        if size > vocab_size:
            raise WorkerError(f"{tokenizer_json}: the tokenizer has {size} tokens; the model's vocab_size is "
                              f"{vocab_size}")
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, dest / ("tokenizer.json" if src.is_file() else f.name))
    return True


@contextmanager
def _staging(out: Path) -> Iterator[Path]:
    """A temporary sibling of `out` renamed to `out` when the block succeeds, removed when it fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            out.rmdir()  # empty (checked before any work): rename needs it gone
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
