"""The Eq. 4-6 parameter counts against the paper's Table 3, to the parameter."""

import pytest

from upscale.sweeps import sizes
from upscale.sweeps.segments import Shape

# Table 3 of the upcycling-scaling-laws paper: N_dense and N_MoE^total (8 experts).
TABLE_3 = {
    "15M": (14_751_680, 92_189_120),
    "44M": (44_248_800, 276_538_080),
    "0.1B": (98_323_840, 614_496_640),
    "0.2B": (232_623_040, 1_453_845_952),
    "0.5B": (521_889_760, 3_261_732_320),
    "1B": (1_085_859_424, 6_786_500_704),
}


@pytest.mark.parametrize("size", TABLE_3)
def test_table_3_counts_exact(size: str) -> None:
    shape = sizes.shape_of(size)
    n_dense, n_total = TABLE_3[size]
    assert sizes.dense_params(shape) == n_dense
    assert sizes.moe_total_params(shape, 8) == n_total


def test_active_params_between_dense_and_total() -> None:
    shape = sizes.shape_of("0.1B")
    n2 = sizes.moe_active_params(shape, 8, 2)
    # Eq. 5: N2 ≈ (4 + 12·k)·L·d² = 28·L·d², i.e. 1.75·N1 for 8x2 (Appendix F.3); exact adds router and norms.
    assert n2 / sizes.dense_params(shape) == pytest.approx(1.75, rel=2e-3)
    assert sizes.moe_active_params(shape, 8, 8) == sizes.moe_total_params(shape, 8)


def test_flops_per_token_counts_attention_and_head() -> None:
    shape = sizes.shape_of("nano")
    n = sizes.dense_params(shape)
    flops = sizes.train_flops_per_token(shape, n, context=128, vocab_size=256)
    assert flops == 6 * (n + 32 * 256) + 12 * 2 * 32 * 128


def test_unknown_size_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown model size 'huge'; valid sizes: nano, micro"):
        sizes.shape_of("huge")


def test_gqa_and_ffn_width_counted_exactly() -> None:
    s = Shape(n_layer=3, d_model=64, n_head=8, n_kv_head=2, ffn_width=100)
    d, d_kv, f = 64, 16, 100
    layer_common = 2 * d * d + 2 * d * d_kv + 2 * d
    assert s.d_kv == d_kv and s.d_ff == f and s.shape == s
    assert sizes.dense_params(s) == 3 * (layer_common + 3 * d * f) + d
    assert sizes.moe_total_params(s, 4) == 3 * (layer_common + 4 * 3 * d * f + 4 * d) + d
    assert sizes.moe_active_params(s, 4, 2, expert_d_ff=50) == 3 * (layer_common + 2 * 3 * d * 50 + 4 * d) + d
