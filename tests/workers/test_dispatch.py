"""The grouped dispatch against DeepSpeed's (the oracle): outputs, gradients and aux loss, one rank and expert
parallel on 2 gloo ranks; the grouped-GEMM kernel against the loop of GEMMs; the two routings."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from upscale.workers.dispatch import experts_grouped_mm, experts_loop
from upscale.workers.distributed import free_port
from upscale.workers.model import ModelConfig, MoEFFN, SwiGLU, build_model
from upscale.workers.parallel import expert_slice

TOL = {"rtol": 0, "atol": 1e-5}


def _cfg(**kw: object) -> ModelConfig:
    return ModelConfig(**{"n_layer": 2, "d_model": 32, "n_head": 2, "vocab_size": 64, "context": 16,
                          "n_expert": 4, "topk": 2, **kw})


def _layer(cfg: ModelConfig, state: dict[str, torch.Tensor] | None = None) -> MoEFFN:
    """One MoE layer with seeded N(0, 0.2^2) weights (the router included: it is allocated empty), or `state`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layer = MoEFFN(cfg)
        with torch.no_grad():
            for p in layer.parameters():
                p.normal_(0, 0.2)
    if state is not None:
        layer.load_state_dict(state)
    return layer


def _run(layer: MoEFFN, x: torch.Tensor, probe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, aux loss, input gradient) of one layer for a fixed linear probe of the output plus the aux loss."""
    x = x.clone().requires_grad_(True)
    y, aux, _ = layer(x)
    ((y * probe).sum() + aux).backward()
    return y.detach(), aux.detach(), x.grad


@pytest.mark.parametrize("routing", ["softmax_topk", "deepspeed"])
@pytest.mark.parametrize("topk", [1, 2, 3])
def test_grouped_equals_deepspeed_forward_backward_aux(topk: int, routing: str) -> None:
    cfg = _cfg(topk=topk, routing=routing)
    oracle = _layer(cfg.updated(dispatch="deepspeed"))
    grouped = _layer(cfg, oracle.state_dict())
    assert type(grouped.moe.deepspeed_moe).__name__ == "GroupedMOELayer"
    gen = torch.Generator().manual_seed(1)
    x, probe = torch.randn(3, 16, 32, generator=gen), torch.randn(3, 16, 32, generator=gen)
    for want, got in zip(_run(oracle, x, probe), _run(grouped, x, probe), strict=True):
        torch.testing.assert_close(got, want, **TOL)
    ref = dict(oracle.named_parameters())
    for name, p in grouped.named_parameters():
        torch.testing.assert_close(p.grad, ref[name].grad, **TOL, msg=name)
    assert torch.equal(grouped.moe.deepspeed_moe.exp_counts, oracle.moe.deepspeed_moe.exp_counts)


def test_whole_model_logits_and_aux_match_across_dispatch() -> None:
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(2))
    (a, aux_a), (b, aux_b) = (build_model(_cfg(dispatch=d), seed=0)(tokens) for d in ("deepspeed", "grouped"))
    torch.testing.assert_close(b, a, **TOL)
    torch.testing.assert_close(aux_b, aux_a, **TOL)


def test_top1_softmax_topk_weights_the_chosen_expert_by_one() -> None:
    cfg = _cfg(topk=1, dispatch="deepspeed")
    layer = _layer(cfg)
    ds = _layer(cfg.updated(routing="deepspeed"), layer.state_dict())
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))
    moe = layer.moe.deepspeed_moe
    flat = x.reshape(-1, 32)
    choice = moe.gate.wg(flat).argmax(-1)
    p_max = torch.softmax(moe.gate.wg(flat), -1).max(-1, keepdim=True).values
    experts = moe.experts.deepspeed_experts
    want = torch.stack([experts[int(e)](t) for t, e in zip(flat, choice, strict=True)])
    with torch.no_grad():
        torch.testing.assert_close(layer(x)[0].reshape(-1, 32), want, **TOL)
        torch.testing.assert_close(ds(x)[0].reshape(-1, 32), p_max * want, **TOL)


def test_grouped_mm_kernel_equals_the_loop_of_gemms() -> None:
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    gen = torch.Generator().manual_seed(4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        experts = [SwiGLU(16, 32) for _ in range(4)]
    counts = [5, 0, 9, 2]  # an expert with no rows included
    rows = torch.randn(sum(counts), 16, generator=gen)
    grad = torch.randn(sum(counts), 16, generator=gen)
    outs = []
    for fn in (lambda r: experts_loop(experts, r, counts),
               lambda r: experts_grouped_mm(experts, r, counts, torch.float32)):
        r = rows.clone().requires_grad_(True)
        (fn(r) * grad).sum().backward()
        outs.append((fn(r).detach(), r.grad, [p.grad.clone() for e in experts for p in e.parameters()]))
        for e in experts:
            e.zero_grad(set_to_none=True)
    (y0, g0, p0), (y1, g1, p1) = outs
    torch.testing.assert_close(y1, y0, **TOL)
    torch.testing.assert_close(g1, g0, **TOL)
    for a, b in zip(p0, p1, strict=True):
        torch.testing.assert_close(b, a, **TOL)


def _ep_rank(rank: int, port: int, topk: int, results: dict) -> None:
    """One of 2 ranks: the grouped layer with ep_size=2 (its half of the experts) against the one-rank oracle."""
    import deepspeed

    torch.set_num_threads(1)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)})
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    cfg = _cfg(topk=topk, n_expert=4)
    oracle = _layer(cfg.updated(dispatch="deepspeed"))
    layer = _layer(cfg.updated(ep_size=2), expert_slice(oracle.state_dict(), cfg, 2, rank))
    layer.moe.set_deepspeed_parallelism()
    gen = torch.Generator().manual_seed(5)
    # each rank has its own tokens (rank 1 more than rank 0: uneven splits); same probes everywhere
    xs = [torch.randn(2, 8, 32, generator=gen), torch.randn(3, 8, 32, generator=gen)]
    probes = [torch.randn(2, 8, 32, generator=gen), torch.randn(3, 8, 32, generator=gen)]
    got = _run(layer, xs[rank], probes[rank])
    want = _run(oracle, xs[rank], probes[rank])
    errors = {f"out{i}": (g - w).abs().max().item() for i, (g, w) in enumerate(zip(got, want, strict=True))}
    router = dict(oracle.named_parameters())
    for name, p in layer.named_parameters():
        if ".deepspeed_experts." not in name:
            errors[name] = (p.grad - router[name].grad).abs().max().item()
    # an expert's gradient sums over the tokens of both ranks: the oracle sees both batches
    oracle.zero_grad(set_to_none=True)
    for x, probe in zip(xs, probes, strict=True):
        _run(oracle, x, probe)
    full = dict(expert_slice(dict(oracle.named_parameters()), cfg, 2, rank))
    for name, p in layer.named_parameters():
        if ".deepspeed_experts." in name:
            errors[name] = (p.grad - full[name].grad).abs().max().item()
    results[rank] = errors
    torch.distributed.destroy_process_group()


@pytest.mark.slow  # two spawned ranks importing DeepSpeed: ~45 s per case on 2 cores
@pytest.mark.parametrize("topk", [1, 2])
def test_expert_parallel_on_two_gloo_ranks_equals_the_single_rank_oracle(topk: int) -> None:
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_ep_rank, args=(free_port(), topk, results), nprocs=2, join=True)
        errors = dict(results)
    assert set(errors) == {0, 1}
    for rank, errs in errors.items():
        assert len(errs) > 5
        assert max(errs.values()) <= 1e-5, (rank, errs)
