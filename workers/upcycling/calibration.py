"""Data passes through the frozen parent model for the methods that need data (llama-moe sharing, router-upcycling,
expansion by utility).

* `attention_inputs`: each layer's attention input (after the pre-attention RMSNorm), what its keys are made of.
* `ffn_importance`: LLaMA-MoE's first-order Taylor importance per neuron and token group,
  v_j = mean over tokens |h_j · dL/dh_j| with h = silu(W_gate x) ⊙ W_up x the input of W_down
  (`importance_type=feature_change`, `kernel=l1_norm`; docs/methods.md, "LLaMA-MoE expert construction"), L the
  next-token loss of the group.
* `sequence_groups`: the n data groups LLaMA-MoE gets by clustering text; here k-means on each sequence's mean
  token embedding (no external sentence encoder needed).
* `routing_scores`: an MoE's mean routing score per layer and expert (softmax over its experts, no loss-free bias),
  expansion's utility.
* `load_calibration`: tokens for the CLI from a torch file or from raw text read as bytes.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, UpscaleLM, seeded_generator
from upscale.workers.upcycling.clustering import kmeans
from upscale.workers.weights import instantiate

_GROUP_STREAM = 5


def check_tokens(tokens: torch.Tensor | None, cfg: ModelConfig, who: str) -> torch.Tensor:
    """Calibration tokens [B, T] of integer ids < vocab_size, 2 <= T <= context; WorkerError otherwise."""
    if tokens is None:
        raise WorkerError(f"{who} needs calibration tokens: a (batch, seq) tensor of token ids from the training "
                          "data (CLI: --calibration FILE)")
    if tokens.dim() != 2 or tokens.dtype not in (torch.int32, torch.int64) or tokens.numel() == 0:
        raise WorkerError(f"{who}: calibration tokens must be a non-empty integer (batch, seq) tensor; "
                          f"got dtype {tokens.dtype}, shape {tuple(tokens.shape)}")
    if not 2 <= tokens.shape[1] <= cfg.context:
        raise WorkerError(f"{who}: calibration sequence length {tokens.shape[1]} must be in [2, {cfg.context}]")
    if int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab_size:
        raise WorkerError(f"{who}: calibration token ids must be in [0, {cfg.vocab_size}); "
                          f"got [{int(tokens.min())}, {int(tokens.max())}]")
    return tokens.long()


def dense_model(dense_sd: dict[str, torch.Tensor], cfg: ModelConfig) -> UpscaleLM:
    """The dense model of `cfg`'s trunk with `dense_sd` loaded, in fp32 eval mode."""
    return instantiate(cfg.dense(), {k: v.float() for k, v in dense_sd.items()}).eval()


@torch.no_grad()
def attention_inputs(dense_sd: dict[str, torch.Tensor], cfg: ModelConfig, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the attention inputs of every calibration token, [B·T, d_model]."""
    model = dense_model(dense_sd, cfg)
    seen: list[torch.Tensor] = []
    hooks = [b.attn.register_forward_pre_hook(lambda _m, args: seen.append(args[0].reshape(-1, args[0].shape[-1])))
             for b in model.blocks]
    try:
        model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return seen


@torch.no_grad()
def routing_scores(moe_sd: dict[str, torch.Tensor], cfg: ModelConfig, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Per MoE layer, the mean over calibration tokens of each expert's softmax routing score, [n_expert]."""
    model = instantiate(cfg, {k: v.float() for k, v in moe_sd.items()}).eval()
    seen: list[torch.Tensor] = []
    hooks = [b.ffn.moe.deepspeed_moe.gate.wg.register_forward_hook(
        lambda _m, _args, logits: seen.append(torch.softmax(logits.float(), -1).mean(0))) for b in model.blocks]
    try:
        model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return seen


def sequence_groups(dense_sd: dict[str, torch.Tensor], tokens: torch.Tensor, n_groups: int, seed: int) -> torch.Tensor:
    """A group label per sequence [B]: k-means on mean token embeddings; every group non-empty."""
    if tokens.shape[0] < n_groups:
        raise WorkerError(f"need at least {n_groups} calibration sequences (one per expert group), "
                          f"got {tokens.shape[0]}")
    emb = dense_sd["tok_emb.weight"].float()[tokens].mean(1)
    return kmeans(emb, n_groups, seeded_generator(seed, _GROUP_STREAM), balanced=True)


def ffn_importance(
    dense_sd: dict[str, torch.Tensor], cfg: ModelConfig, tokens: torch.Tensor, groups: torch.Tensor, n_groups: int
) -> torch.Tensor:
    """Taylor importance [n_layer, n_groups, d_ff] of every FFN neuron for every sequence group."""
    model = dense_model(dense_sd, cfg)
    hs: list[torch.Tensor] = []
    hooks = [b.ffn.w_down.register_forward_pre_hook(lambda _m, args: hs.append(args[0])) for b in model.blocks]
    out = torch.zeros(cfg.n_layer, n_groups, cfg.d_ff)
    try:
        for g in range(n_groups):
            batch = tokens[groups == g]
            hs.clear()
            logits, _ = model(batch)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            grads = torch.autograd.grad(loss, hs)
            for l, (h, dh) in enumerate(zip(hs, grads, strict=True)):
                out[l, g] = (h * dh).abs().reshape(-1, cfg.d_ff).mean(0).detach()
    finally:
        for h in hooks:
            h.remove()
    return out


def load_calibration(path: str | Path, cfg: ModelConfig, seq_len: int = 128, max_seqs: int = 64) -> torch.Tensor:
    """Calibration tokens from a file: a torch file holding an integer [B, T] tensor, or any other file read as
    bytes and cut into sequences of min(seq_len, context) byte tokens (needs vocab_size >= 256)."""
    src = Path(path)
    if not src.is_file():
        raise WorkerError(f"calibration file {src} does not exist")
    if src.suffix == ".pt":
        try:
            tokens = torch.load(src, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many types for a corrupt or foreign file
            raise WorkerError(f"{src} is not a readable torch file: {e}") from None
        if not isinstance(tokens, torch.Tensor):
            raise WorkerError(f"{src} must hold a (batch, seq) tensor of token ids, got {type(tokens).__name__}")
        return check_tokens(tokens, cfg, f"calibration file {src}")
    if cfg.vocab_size < 256:
        raise WorkerError(f"byte-level calibration text needs vocab_size >= 256; the model has {cfg.vocab_size}")
    t = min(seq_len, cfg.context)
    data = torch.frombuffer(bytearray(src.read_bytes()), dtype=torch.uint8).long()
    n = min(max_seqs, data.numel() // t)
    if n == 0:
        raise WorkerError(f"calibration file {src} has {data.numel()} bytes; need at least {t}")
    return data[: n * t].view(n, t)
