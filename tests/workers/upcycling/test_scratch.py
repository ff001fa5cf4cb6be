"""From scratch: exactly `build_model(cfg, seed)`, whatever the dense weights, sharing naive's router draw."""

from __future__ import annotations

import torch

from upscale.workers.model import ModelConfig, build_model
from upscale.workers.upcycling import method_spec, upcycle


def test_scratch_is_build_model_and_ignores_the_dense_weights(dense_cfg: ModelConfig, dense_sd: dict) -> None:
    moe_cfg = dense_cfg.updated(n_expert=4, topk=2)
    cfg, sd = upcycle(dense_sd, moe_cfg, method_spec("scratch", seed=9))
    other = {k: v + 1 for k, v in dense_sd.items()}
    _, sd_other = upcycle(other, moe_cfg, method_spec("scratch", seed=9))
    ref = build_model(moe_cfg, seed=9).state_dict()
    assert cfg == moe_cfg
    assert all(torch.equal(sd[k], ref[k]) and torch.equal(sd_other[k], ref[k]) for k in ref)
    assert not torch.equal(sd["tok_emb.weight"], dense_sd["tok_emb.weight"])
    # same seed, same fresh router as naive upcycling: scratch and upcycled runs differ only in what they inherit
    naive = upcycle(dense_sd, moe_cfg, method_spec("naive", seed=9))[1]
    key = "blocks.1.ffn.moe.deepspeed_moe.gate.wg.weight"
    assert torch.equal(naive[key], sd[key])
