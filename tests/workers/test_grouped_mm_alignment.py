"""`torch._grouped_mm` only where its 16-byte stride rule holds, the loop of GEMMs otherwise.

The rule is torch's: its CPU kernel applies the same stride check as the CUDA one ("strides should be multiple of
16 bytes"), so on this machine the selection is compared with what torch itself accepts for the very calls
`experts_grouped_mm` makes. On a CUDA machine (`pytest -m gpu`) a d_model=36 grouped MoE layer runs under bf16
autocast and matches the fp32 computation: the loop was taken instead of a kernel that would raise."""

from __future__ import annotations

import pytest
import torch

from upscale.workers.dispatch import experts_grouped_mm, grouped_mm_dtype
from upscale.workers.model import ModelConfig, MoEFFN, SwiGLU

BF16 = torch.bfloat16


def test_selection_needs_cuda_bf16_and_widths_of_whole_16_byte_rows() -> None:
    assert grouped_mm_dtype("cuda", BF16, 32, 128) == BF16
    assert grouped_mm_dtype("cuda", BF16, 36, 144) is None  # d_model 36: 72-byte rows
    assert grouped_mm_dtype("cuda", BF16, 32, 100) is None  # an expert slice of d_ff=100
    assert grouped_mm_dtype("cpu", BF16, 32, 128) is None
    assert grouped_mm_dtype("cuda", torch.float32, 32, 128) is None


def _experts(d: int, f: int) -> list[SwiGLU]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return [SwiGLU(d, f) for _ in range(3)]


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")
@pytest.mark.parametrize(("d", "f"), [(32, 64), (36, 144), (32, 100), (40, 72), (24, 60)])
def test_selection_agrees_with_torchs_own_alignment_check(d: int, f: int) -> None:
    experts, counts = _experts(d, f), [3, 0, 5]  # an expert without rows included
    rows = torch.randn(sum(counts), d, generator=torch.Generator().manual_seed(1))
    try:
        experts_grouped_mm(experts, rows, counts, BF16)
        accepted = True
    except RuntimeError as e:
        assert "16 bytes" in str(e)
        accepted = False
    assert accepted == (grouped_mm_dtype("cuda", BF16, d, f) is not None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_unaligned_grouped_layer_runs_on_cuda_under_bf16_autocast() -> None:
    cfg = ModelConfig(n_layer=1, d_model=36, n_head=2, vocab_size=64, context=16, n_expert=4, topk=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layer = MoEFFN(cfg).cuda()
    x = torch.randn(2, 16, 36, device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    with torch.no_grad():
        want, _, _ = layer(x)
        with torch.autocast("cuda", dtype=BF16):
            got, _, _ = layer(x)  # _grouped_mm would raise: the loop of bf16 GEMMs ran
    torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.05)
