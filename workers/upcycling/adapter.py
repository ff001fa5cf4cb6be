"""Checkpoint-key adapter: dense FFN tensors out of a dense state dict, MoE tensors into an MoE state dict.

The methods do pure tensor math on one layer's (W_gate, W_up, W_down); only this module knows the state-dict
names of `workers.model` (torchtitan's state_dict_adapter split), so a renamed module touches one file.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, init_router, seeded_generator

FFN = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (W_gate [f, d], W_up [f, d], W_down [d, f])

_MATRICES = ("w_gate", "w_up", "w_down")
_MOE = "blocks.{l}.ffn.moe.deepspeed_moe"
_BIAS = "gate.route_bias"  # loss-free balancing's routing bias, under _MOE


@dataclass
class LayerMoE:
    """One MoE layer as tensors: experts, router parameters (names under `gate.wg`), optional shared expert, the
    loss-free routing bias (None = zeros; used only when cfg.balancing is "loss_free")."""

    experts: list[FFN]
    router: dict[str, torch.Tensor]
    shared: FFN | None = None
    bias: torch.Tensor | None = None


def dense_ffn(dense_sd: dict[str, torch.Tensor], layer: int) -> FFN:
    """Layer `layer`'s FFN in fp32 (statistics and slicing are done in fp32 whatever the checkpoint dtype)."""
    g, u, d = (dense_sd[f"blocks.{layer}.ffn.{m}.weight"].float() for m in _MATRICES)
    return g, u, d


def attention(dense_sd: dict[str, torch.Tensor], cfg: ModelConfig, layer: int, name: str) -> torch.Tensor:
    """One attention projection (`wq`, `wk`, `wv`, `wo`) of layer `layer`, [d_model, d_model]: with grouped-query
    attention the K/V heads are repeated to one per query head, the projection that the attention computes."""
    w = dense_sd[f"blocks.{layer}.attn.{name}.weight"].float()
    if name in ("wk", "wv") and cfg.kv_heads != cfg.n_head:
        w = w.view(cfg.kv_heads, -1, cfg.d_model).repeat_interleave(cfg.n_head // cfg.kv_heads, dim=0)
    return w.reshape(-1, cfg.d_model)


def fresh_router(cfg: ModelConfig, seed: int, layer: int) -> dict[str, torch.Tensor]:
    """The router `build_model(cfg, seed)` would draw for this layer (so scratch and upcycled runs share it)."""
    return init_router(cfg, seeded_generator(seed, 1, layer))


def assemble(dense_sd: dict[str, torch.Tensor], cfg: ModelConfig, layers: list[LayerMoE]) -> dict[str, torch.Tensor]:
    """MoE state dict: every non-FFN tensor copied from the dense one, FFNs replaced by `layers`."""
    if len(layers) != cfg.n_layer:
        raise WorkerError(f"got {len(layers)} MoE layers for a model of n_layer={cfg.n_layer}")
    dtype = dense_sd["tok_emb.weight"].dtype
    out = {k: v.clone() for k, v in dense_sd.items() if ".ffn." not in k}
    for l, lay in enumerate(layers):
        if len(lay.experts) != cfg.n_expert:
            raise WorkerError(f"layer {l}: {len(lay.experts)} experts built, config wants {cfg.n_expert}")
        base = _MOE.format(l=l)
        for name, t in lay.router.items():
            out[f"{base}.gate.wg.{name}"] = t.to(dtype)
        if cfg.balancing == "loss_free":  # the routing bias starts at zero (fp32, as the model holds it)
            out[f"{base}.{_BIAS}"] = torch.zeros(cfg.n_expert) if lay.bias is None else lay.bias.float()
        for e, ffn in enumerate(lay.experts):
            for m, t in zip(_MATRICES, ffn, strict=True):
                out[f"{base}.experts.deepspeed_experts.{e}.{m}.weight"] = t.to(dtype).contiguous()
        if lay.shared is not None:
            for m, t in zip(_MATRICES, lay.shared, strict=True):
                out[f"blocks.{l}.ffn.shared.{m}.weight"] = t.to(dtype).contiguous()
    return out


def experts_of(moe_sd: dict[str, torch.Tensor], cfg: ModelConfig, layer: int) -> list[FFN]:
    """The experts of one MoE layer (fp32), the inverse of `assemble` for reports and tests."""
    base = _MOE.format(l=layer)
    return [
        tuple(moe_sd[f"{base}.experts.deepspeed_experts.{e}.{m}.weight"].float() for m in _MATRICES)  # type: ignore[misc]
        for e in range(cfg.n_expert)
    ]


def router_of(moe_sd: dict[str, torch.Tensor], layer: int) -> dict[str, torch.Tensor]:
    """Router parameters of one MoE layer, keyed by their name under `gate.wg`."""
    prefix = _MOE.format(l=layer) + ".gate.wg."
    return {k[len(prefix):]: v for k, v in moe_sd.items() if k.startswith(prefix)}


def bias_of(moe_sd: dict[str, torch.Tensor], layer: int) -> torch.Tensor | None:
    """The loss-free routing bias of one MoE layer (fp32), or None for a model balanced by the aux loss."""
    bias = moe_sd.get(f"{_MOE.format(l=layer)}.{_BIAS}")
    return None if bias is None else bias.float()


def shared_of(moe_sd: dict[str, torch.Tensor], layer: int) -> FFN | None:
    """The always-on shared expert of one layer (fp32), or None if the model has none."""
    names = [f"blocks.{layer}.ffn.shared.{m}.weight" for m in _MATRICES]
    if names[0] not in moe_sd:
        return None
    return tuple(moe_sd[n].float() for n in names)  # type: ignore[return-value]
