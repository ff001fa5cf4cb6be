"""Drop-Upcycling (docs/methods.md, "Drop-Upcycling"): exactly floor(r·f) neurons redrawn per matrix, shared index sets,
statistics kept.

Changed neurons are found by comparing each expert with the dense FFN: a redrawn entry is a continuous draw, so it
equals the old value with probability 0.
"""

from __future__ import annotations

import math

import pytest
import torch

from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, seeded_generator
from upscale.workers.upcycling import method_spec, upcycle
from upscale.workers.upcycling.adapter import dense_ffn, experts_of
from upscale.workers.upcycling.drop import drop_expert
from upscale.workers.weights import instantiate


def changed_neurons(expert: tuple, dense: tuple) -> list[set[int]]:
    """Per matrix (gate, up, down), the set of neurons with any changed entry."""
    g, u, d = ((a != b) for a, b in zip(expert, dense, strict=True))
    return [set(torch.nonzero(m.any(dim=ax)).flatten().tolist()) for m, ax in ((g, 1), (u, 1), (d, 0))]


def test_r0_is_naive_and_preserves_the_function(dense_cfg: ModelConfig, dense_sd: dict, dense_model, tokens) -> None:
    moe_cfg = dense_cfg.updated(n_expert=4, topk=2)
    cfg, sd = upcycle(dense_sd, moe_cfg, method_spec("drop", r=0.0, seed=5))
    naive = upcycle(dense_sd, moe_cfg, method_spec("naive", seed=5))[1]
    assert all(torch.equal(sd[k], naive[k]) for k in naive)
    with torch.no_grad():
        diff = (instantiate(cfg, sd).eval()(tokens)[0] - dense_model(tokens)[0]).abs().max().item()
    assert diff <= 1e-5


@pytest.mark.parametrize("r", [0.1, 0.5, 1.0])
@pytest.mark.parametrize("mode", ["shared", "per_matrix"])
def test_exactly_floor_r_f_neurons_per_matrix(dense_cfg: ModelConfig, dense_sd: dict, r: float, mode: str) -> None:
    cfg, sd = upcycle(dense_sd, dense_cfg.updated(n_expert=4, topk=2), method_spec("drop", r=r, index_mode=mode))
    f = cfg.d_ff
    k = math.floor(r * f)
    intact = []
    for l in range(cfg.n_layer):
        dense = dense_ffn(dense_sd, l)
        for expert in experts_of(sd, cfg, l):
            sets = changed_neurons(expert, dense)
            assert [len(s) for s in sets] == [k, k, k]
            if mode == "shared":
                assert sets[0] == sets[1] == sets[2]
            intact.append(f - len(sets[0] | sets[1] | sets[2]))
    frac = sum(intact) / (len(intact) * f)
    if mode == "shared":
        assert frac == pytest.approx(1 - k / f, abs=1e-12)
    elif 0 < r < 1:
        # independent sets: expected (1 - r)^3 intact; 8 experts x 128 neurons -> binomial sd ~0.015
        assert abs(frac - (1 - r) ** 3) < 0.06


@pytest.mark.parametrize("r", [0.5, 1.0])
def test_new_statistics_match_the_old(r: float) -> None:
    # a large matrix with a non-zero mean: redrawn entries ~ N(mu, sigma) of the selected entries of that matrix
    gen = torch.Generator().manual_seed(0)
    f, d = 1024, 256
    ffn = tuple(torch.randn(*shape, generator=gen) * s + m for shape, s, m in
                (((f, d), 0.03, 0.001), ((f, d), 0.02, -0.002), ((d, f), 0.01, 0.0005)))
    new = drop_expert(ffn, r, "shared", seeded_generator(1, 2))
    for old, w, ax in zip(ffn, new, (1, 1, 0), strict=True):
        changed = (old != w).any(dim=ax)
        o = old[changed] if ax == 1 else old[:, changed]
        n = w[changed] if ax == 1 else w[:, changed]
        # 5 standard errors of the difference of two independent samples of this size
        se_mean = math.sqrt(2) * o.std().item() / math.sqrt(o.numel())
        se_std_ratio = math.sqrt(1 / o.numel())
        assert abs(n.mean().item() - o.mean().item()) < 5 * se_mean
        assert abs(n.std().item() / o.std().item() - 1) < 5 * se_std_ratio


def test_experts_differ_and_seeds_reproduce(dense_cfg: ModelConfig, dense_sd: dict) -> None:
    moe_cfg = dense_cfg.updated(n_expert=4, topk=2)
    a, b, c = (upcycle(dense_sd, moe_cfg, method_spec("drop", r=0.5, seed=s))[1] for s in (1, 1, 2))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if "experts" in k)
    experts = experts_of(a, moe_cfg, 0)
    dense = dense_ffn(dense_sd, 0)
    sets = [frozenset(changed_neurons(e, dense)[0]) for e in experts]
    assert len(set(sets)) == 4  # a different index set per expert


@pytest.mark.parametrize("r", [-0.1, 1.5])
def test_r_outside_unit_interval_is_rejected(r: float) -> None:
    with pytest.raises(WorkerError, match=rf"r: Input should be (greater|less) than or equal to [01].* \(got {r}\)"):
        method_spec("drop", r=r)


def test_drop_needs_full_width_experts(dense_cfg: ModelConfig, dense_sd: dict) -> None:
    with pytest.raises(WorkerError, match="drop upcycling copies the FFN: it needs expert_d_ff = d_ff = 128"):
        upcycle(dense_sd, dense_cfg.updated(n_expert=4, topk=2, expert_d_ff=64), method_spec("drop"))
