"""Noise upcycling (docs/methods.md, "Noise upcycling"), both recipes: OLMoE's element-wise replacement and
Drop-Upcycling's baseline.

replace_elementwise: the replaced fraction is Binomial(N, ratio)/N (tolerance 5 binomial sds), unmasked entries are
bit-identical, replaced entries ~ N(0, std²); add_neuronwise: exactly floor(ratio·f) neurons per matrix changed by an
added N(0, std²). Ratio 0 is naive upcycling in both.
"""

from __future__ import annotations

import math

import pytest
import torch

from upscale.workers.model import ModelConfig, seeded_generator
from upscale.workers.upcycling import method_spec, upcycle
from upscale.workers.upcycling.adapter import dense_ffn, experts_of
from upscale.workers.upcycling.noise import add_neuronwise, replace_elementwise


def big_ffn() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*shape, generator=gen) for shape in ((512, 128), (512, 128), (128, 512)))


@pytest.mark.parametrize("ratio", [0.1, 0.5])
def test_replace_elementwise(ratio: float) -> None:
    ffn = big_ffn()  # entries ~ N(0, 1): a replaced entry (std 0.02) never equals its old value
    new = replace_elementwise(ffn, ratio, 0.02, seeded_generator(0, 3))
    for old, w in zip(ffn, new, strict=True):
        mask = old != w
        n = mask.numel()
        assert abs(mask.float().mean().item() - ratio) < 5 * math.sqrt(ratio * (1 - ratio) / n)
        assert torch.equal(w[~mask], old[~mask])
        k = int(mask.sum())
        assert abs(w[mask].mean().item()) < 5 * 0.02 / math.sqrt(k)
        assert abs(w[mask].std().item() / 0.02 - 1) < 5 / math.sqrt(2 * k)


def test_add_neuronwise() -> None:
    ffn = big_ffn()
    new = add_neuronwise(ffn, 0.5, 0.02, seeded_generator(0, 3))
    sets = []
    for old, w, ax in zip(ffn, new, (1, 1, 0), strict=True):
        delta = w - old
        changed = (delta != 0).any(dim=ax)
        assert int(changed.sum()) == 256  # floor(0.5 · 512)
        sel = delta[changed] if ax == 1 else delta[:, changed]
        assert abs(sel.std().item() / 0.02 - 1) < 0.05
        sets.append(frozenset(torch.nonzero(changed).flatten().tolist()))
    assert len(set(sets)) == 3  # independent sets per matrix, as the Drop-Upcycling baseline


@pytest.mark.parametrize("variant", ["replace_elementwise", "add_neuronwise"])
def test_masks_differ_across_experts_and_ratio_0_is_naive(
    dense_cfg: ModelConfig, dense_sd: dict, variant: str
) -> None:
    moe_cfg = dense_cfg.updated(n_expert=4, topk=2)
    cfg, sd = upcycle(dense_sd, moe_cfg, method_spec("noise", noise_variant=variant, seed=2))
    dense = dense_ffn(dense_sd, 0)
    masks = [(e[0] != dense[0]) for e in experts_of(sd, cfg, 0)]
    assert all(m.any() for m in masks)
    assert all(not torch.equal(a, b) for i, a in enumerate(masks) for b in masks[i + 1:])
    zero = upcycle(dense_sd, moe_cfg, method_spec("noise", noise_variant=variant, noise_ratio=0.0, seed=2))[1]
    naive = upcycle(dense_sd, moe_cfg, method_spec("naive", seed=2))[1]
    assert all(torch.equal(zero[k], naive[k]) for k in naive)
