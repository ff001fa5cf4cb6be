"""Routing stays fp32 under bf16 autocast (how training runs on CUDA): the router's logits are float32 and the
routing decisions (experts chosen, gate values, load-balancing loss, counts) are bit-identical to the same gate
run without autocast. CPU autocast casts `linear` to bf16 just as CUDA autocast does, so a router computed under
it would give bf16 logits here, and other gate values."""

from __future__ import annotations

import pytest
import torch

from tests.workers.test_dispatch import _layer
from upscale.workers.model import ModelConfig


def _gate(router_type: str, topk: int) -> torch.nn.Module:
    cfg = ModelConfig(n_layer=1, d_model=32, n_head=2, vocab_size=64, context=16, n_expert=4, topk=topk,
                      router_type=router_type)
    return _layer(cfg).moe.deepspeed_moe.gate


@pytest.mark.parametrize("topk", [1, 2, 3])
@pytest.mark.parametrize("router_type", ["linear", "mixture", "mlp"])
def test_routing_under_bf16_autocast_is_the_fp32_routing(router_type: str, topk: int) -> None:
    gate = _gate(router_type, topk)
    logits: list[torch.Tensor] = []
    gate.wg.register_forward_hook(lambda _m, _i, out: logits.append(out))
    x = torch.randn(48, 32, generator=torch.Generator().manual_seed(1))
    want = gate(x, None, True, False)  # sparse form: l_aux, capacity, n_expert, indices, locations, gates, counts
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = gate(x, None, True, False)
    assert [t.dtype for t in logits] == [torch.float32, torch.float32]
    assert torch.equal(logits[1], logits[0])
    l_aux, _, _, indices, _, gates, counts = got
    assert gates.dtype == torch.float32 and l_aux.dtype == torch.float32
    assert torch.equal(indices, want[3]) and torch.equal(gates, want[5]) and torch.equal(counts, want[6])
    assert torch.equal(l_aux, want[0])
