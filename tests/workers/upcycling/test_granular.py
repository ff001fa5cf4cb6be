"""Granular (virtual-group) upcycling (docs/methods.md, "Granular upcycling"): router rows replicated per group, shards
that reassemble the dense FFN, exact function preservation with the factor G on W_down, and the cube-root variant shown
approximate.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig
from upscale.workers.upcycling import method_spec, upcycle
from upscale.workers.upcycling.adapter import dense_ffn, experts_of, router_of
from upscale.workers.weights import instantiate


@pytest.mark.parametrize(("g", "k"), [(2, 2), (2, 4), (4, 4)])
def test_router_rows_shards_and_exact_preservation(
    dense_cfg: ModelConfig, dense_sd: dict, dense_model, tokens, g: int, k: int
) -> None:
    cfg, sd = upcycle(dense_sd, dense_cfg.updated(n_expert=8, topk=k), method_spec("granular", granularity=g))
    assert cfg.d_expert == cfg.d_ff // g
    for l in range(cfg.n_layer):
        w = router_of(sd, l)["weight"]
        for e in range(8):
            assert torch.equal(w[e], w[(e // g) * g])
        assert len({tuple(w[e].tolist()) for e in range(8)}) == 8 // g
        experts = experts_of(sd, cfg, l)
        dense = dense_ffn(dense_sd, l)
        group = experts[:g]  # a virtual group: shards 0..G-1
        assert torch.equal(torch.cat([e[0] for e in group]), dense[0])
        assert torch.equal(torch.cat([e[1] for e in group]), dense[1])
        torch.testing.assert_close(torch.cat([e[2] for e in group], dim=1) / g, dense[2], rtol=0, atol=0)
    with torch.no_grad():
        diff = (instantiate(cfg, sd).eval()(tokens)[0] - dense_model(tokens)[0]).abs().max().item()
    assert diff <= 1e-5


def test_megatron_cube_root_scaling_is_only_approximate_for_swiglu(dense_sd: dict) -> None:
    # a^(1/3) on all three matrices (Megatron) vs the whole a on W_down (ours), G = 2, a selected group = 2 x 1/2
    gate, up, down = dense_ffn(dense_sd, 0)
    x = torch.randn(64, gate.shape[1], generator=torch.Generator().manual_seed(0))
    dense = F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)

    def group_output(scale_all: float, scale_down: float) -> torch.Tensor:
        out = torch.zeros_like(dense)
        for s in (slice(0, 64), slice(64, 128)):
            h = F.silu(F.linear(x, gate[s] * scale_all)) * F.linear(x, up[s] * scale_all)
            out += 0.5 * F.linear(h, down[:, s] * scale_all * scale_down)
        return out

    assert (group_output(1.0, 2.0) - dense).abs().max().item() < 1e-6
    assert (group_output(2.0 ** (1 / 3), 1.0) - dense).abs().max().item() > 1e-3 * dense.abs().max().item()


@pytest.mark.parametrize(
    ("fields", "g", "message"),
    [
        ({"n_expert": 8, "topk": 3}, 2, "topk=3 is not a multiple of granularity=2"),
        ({"n_expert": 6, "topk": 3}, 3, "granularity=3 does not divide d_ff=128"),
        ({"n_expert": 6, "topk": 4}, 4, "granularity=4 does not divide n_expert=6"),
    ],
)
def test_bad_granularity(dense_cfg: ModelConfig, dense_sd: dict, fields: dict, g: int, message: str) -> None:
    with pytest.raises(WorkerError, match=message):
        upcycle(dense_sd, dense_cfg.updated(**fields), method_spec("granular", granularity=g))
