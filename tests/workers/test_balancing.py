"""Loss-free balancing (docs/methods.md, "Loss-free balancing"): the bias picks experts and never weighs them, in
both dispatches; on a skewed router it evens the load that stays skewed without it; it round-trips with the
checkpoint; the options are checked by name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from upscale.sweeps.segments import OptimSpec
from upscale.workers import checkpoints
from upscale.workers.distributed import free_port
from upscale.workers.engine import build_engine, train_step
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, UpscaleLM, build_model
from upscale.workers.parallel import Ranks
from upscale.workers.weights import instantiate

CFG = ModelConfig(n_layer=2, d_model=32, n_head=2, vocab_size=64, context=16, n_expert=8, topk=2,
                  balancing="loss_free", balancing_rate=0.01)
OPTIM = OptimSpec(lr=1e-3, batch_size=8)
TOKENS = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(3))


def batch(i: int) -> torch.Tensor:
    return torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(i))


def gates(model: UpscaleLM) -> list:
    return [b.ffn.moe.deepspeed_moe.gate for b in model.blocks]


def reference_moe(moe, x: torch.Tensor, k: int, renormalise: bool) -> torch.Tensor:
    """The MoE layer written out: choose the top-k of scores + bias, weigh by the unbiased scores."""
    gate = moe.deepspeed_moe.gate
    scores = torch.softmax(gate.wg(x), -1)
    chosen = torch.topk(scores + gate.route_bias, k, dim=-1).indices
    w = scores.gather(1, chosen)
    w = w / w.sum(-1, keepdim=True) if renormalise else w
    experts = moe.deepspeed_moe.experts.deepspeed_experts
    return torch.stack([sum(w[s, j] * experts[int(chosen[s, j])](x[s]) for j in range(k)) for s in range(len(x))])


@pytest.mark.parametrize("dispatch", ["grouped", "deepspeed"])
@pytest.mark.parametrize(("topk", "routing"), [(2, "softmax_topk"), (1, "deepspeed")])
def test_bias_chooses_and_unbiased_scores_weigh(dispatch: str, topk: int, routing: str) -> None:
    cfg = CFG.updated(dispatch=dispatch, topk=topk, routing=routing)
    model = build_model(cfg, seed=0).eval()
    plain = instantiate(cfg.updated(balancing="aux_loss"),
                        {k: v for k, v in model.state_dict().items() if not k.endswith("route_bias")}).eval()
    with torch.no_grad():
        assert torch.allclose(model(TOKENS)[0], plain(TOKENS)[0], atol=1e-6)  # a zero bias: the plain router
        for gate in gates(model):
            gate.route_bias[-topk:] = 1.0  # above any score gap: the last k experts always win
        x = torch.randn(12, cfg.d_model, generator=torch.Generator().manual_seed(0))
        moe = model.blocks[0].ffn.moe
        assert torch.allclose(moe(x)[0], reference_moe(moe, x, topk, renormalise=topk > 1), atol=1e-6)
        model(TOKENS)
    assert all(c[-topk:].sum() == TOKENS.numel() * topk for c in model.expert_counts)  # every token took them


def skewed(cfg: ModelConfig) -> UpscaleLM:
    """A model whose routers push every token toward expert 0: its row gains the mean FFN input of a batch."""
    model = build_model(cfg, seed=0)
    seen: list[torch.Tensor] = []
    hooks = [b.ffn_norm.register_forward_hook(lambda _m, _a, out: seen.append(out.reshape(-1, out.shape[-1]).mean(0)))
             for b in model.blocks]
    with torch.no_grad():
        model(TOKENS)
        for gate, mean in zip(gates(model), seen, strict=True):
            gate.wg.weight[0] += 5 * mean / mean.norm() ** 2
    for h in hooks:
        h.remove()
    return model


def imbalance(cfg: ModelConfig, steps: int) -> float:
    """max/mean expert load over the last 20 of `steps` training steps (the worse layer), the aux loss off."""
    engine = build_engine(skewed(cfg), OPTIM)
    loads = torch.zeros(cfg.n_layer, cfg.n_expert)
    for i in range(steps):
        train_step(engine, batch(i), 1e-3, 0.0, "cpu")
        if i >= steps - 20:
            loads += torch.stack(engine.module.expert_counts).float()
    return float((loads.max(1).values / loads.mean(1)).max())


@pytest.mark.parametrize("dispatch", ["grouped", "deepspeed"])
def test_loss_free_evens_a_skewed_router(dist_group: None, dispatch: str) -> None:
    cfg = CFG.updated(dispatch=dispatch)
    at_start = imbalance(cfg, 20)  # 20 steps of +-0.01 move no expert's bias past 0.2: still skewed
    assert at_start > 2.5  # of at most 4 (top-2 of 8)
    assert imbalance(cfg, 200) < 1.4


def test_without_the_bias_the_skew_stays(dist_group: None) -> None:
    assert imbalance(CFG.updated(balancing="aux_loss"), 200) > 1.8


def test_bias_round_trips_with_the_checkpoint(tmp_path: Path, dist_group: None) -> None:
    a = build_engine(build_model(CFG, seed=0), OPTIM)
    for i in range(3):
        train_step(a, batch(i), 1e-3, CFG.aux_loss_weight, "cpu")
    bias = {k: v for k, v in a.module.state_dict().items() if k.endswith("gate.route_bias")}
    assert len(bias) == CFG.n_layer and all(v.abs().max() > 0 for v in bias.values())
    path = checkpoints.save(a, tmp_path, 24, CFG, {"segment_id": "s"})
    b = build_engine(build_model(CFG, seed=1), OPTIM)
    checkpoints.load(b, path, CFG)
    assert all(torch.equal(b.module.state_dict()[k], v) for k, v in bias.items())
    _, exported = checkpoints.load_weights(path)
    assert all(torch.equal(exported[k], v) for k, v in bias.items())
    assert train_step(a, batch(9), 1e-3, 0.0, "cpu") == train_step(b, batch(9), 1e-3, 0.0, "cpu")
    assert all(torch.equal(a.module.state_dict()[k], b.module.state_dict()[k]) for k in bias)


def _expert_parallel_rank(rank: int, port: int, results: dict) -> None:
    """One of 2 ranks training the expert-parallel (ep_size=2) model one step on its half of a batch."""
    import deepspeed

    torch.set_num_threads(1)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)})
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    engine = build_engine(build_model(CFG.updated(ep_size=2), seed=0, ep_rank=rank), OPTIM, ranks=Ranks(rank, 2))
    train_step(engine, batch(0), 1e-3, 0.0, "cpu", Ranks(rank, 2))
    results[rank] = [g.route_bias.clone() for g in gates(engine.module)]
    torch.distributed.destroy_process_group()


@pytest.mark.slow  # two spawned ranks importing DeepSpeed
def test_expert_parallel_ranks_balance_on_the_loads_of_all_ranks() -> None:
    # before the first step the weights are the single-process model's, so every token is routed the same: the
    # update must come from the whole batch's loads, on both ranks, and a rank's own half would give another one
    def update(rows: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad():
            model(rows[:, :-1])
        return [CFG.balancing_rate * torch.sign(c.float().mean() - c.float()) for c in model.expert_counts]

    model = build_model(CFG, seed=0)
    want = update(batch(0))
    assert any(not torch.equal(a, b) for half in batch(0).chunk(2) for a, b in zip(update(half), want, strict=True))
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_expert_parallel_rank, args=(free_port(), results), nprocs=2, join=True)
        got = dict(results)
    assert set(got) == {0, 1}
    for biases in got.values():
        assert all(torch.equal(b, w) for b, w in zip(biases, want, strict=True))


def test_loss_free_drops_the_aux_term_and_refuses_what_cannot_learn() -> None:
    assert CFG.aux_loss_weight == 0.0 and CFG.updated(balancing="aux_loss").aux_loss_weight == CFG.aux_loss_coef
    with pytest.raises(WorkerError, match=r"loss_free.*dense model"):
        CFG.dense().updated(balancing="loss_free")
    with pytest.raises(WorkerError, match=r"topk=1 and routing='softmax_topk'.*without gradient"):
        CFG.updated(topk=1, routing="softmax_topk")
    with pytest.raises(WorkerError, match=r"balancing_rate"):
        CFG.updated(balancing_rate=0.0)
    with pytest.raises(WorkerError, match=r"balancing"):
        CFG.updated(balancing="sometimes")
