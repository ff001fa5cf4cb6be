"""The upcycling report: its figures are recomputed independently of how each method built its experts."""

from __future__ import annotations

import math

import pytest

from upscale.sweeps import sizes
from upscale.workers.model import ModelConfig
from upscale.workers.upcycling import method_spec, upcycle
from upscale.workers.upcycling.report import upcycle_report

KEYS = {"method", "max_abs_logit_diff", "reinit_fraction", "intact_neuron_fraction", "experts_distinct", "params",
        "init"}


def report(dense_cfg: ModelConfig, dense_sd: dict, method: str, n: int = 4, k: int = 2, **opts: object) -> dict:
    spec = method_spec(method, **opts)
    cfg, sd = upcycle(dense_sd, dense_cfg.updated(n_expert=n, topk=k), spec)
    return upcycle_report(spec, dense_cfg, dense_sd, cfg, sd)


def test_naive_report(dense_cfg: ModelConfig, dense_sd: dict) -> None:
    r = report(dense_cfg, dense_sd, "naive")
    assert set(r) == KEYS and r["method"] == "naive"
    assert r["max_abs_logit_diff"] <= 1e-5
    assert r["reinit_fraction"] == {"gate": 0.0, "up": 0.0, "down": 0.0}
    assert r["intact_neuron_fraction"] == 1.0 and r["experts_distinct"] is False
    shape = dense_cfg.shape
    assert r["params"] == {"n1": sizes.dense_params(shape), "n2": sizes.moe_active_params(shape, 4, 2),
                           "n_total": sizes.moe_total_params(shape, 4)}


@pytest.mark.parametrize("mode", ["shared", "per_matrix"])
def test_drop_report(dense_cfg: ModelConfig, dense_sd: dict, mode: str) -> None:
    r = report(dense_cfg, dense_sd, "drop", r=0.25, index_mode=mode)
    frac = math.floor(0.25 * 128) / 128
    assert r["reinit_fraction"] == {"gate": frac, "up": frac, "down": frac}
    assert r["experts_distinct"] is True and r["max_abs_logit_diff"] > 1e-4
    assert r["init"] == {"routing": "softmax_topk", "router_type": "linear", "router_init": "normal_2_5d",
                         "index_mode": mode}
    if mode == "shared":
        assert r["intact_neuron_fraction"] == 1 - frac
    else:
        assert abs(r["intact_neuron_fraction"] - (1 - frac) ** 3) < 0.06


def test_split_and_scratch_reports(dense_cfg: ModelConfig, dense_sd: dict) -> None:
    split = report(dense_cfg, dense_sd, "llama-moe")
    assert split["reinit_fraction"] == {"gate": 0.0, "up": 0.0, "down": 0.0}  # slices, W_down scaled by n/k
    assert split["intact_neuron_fraction"] == 1.0 and split["experts_distinct"] is True
    assert split["init"] == {"routing": "softmax_topk", "router_type": "mlp", "router_init": "normal_0.02",
                             "gate_init": "official"}
    # the experts partition the FFN: N_total = N1 + the MLP gates (Linear(d, n) and Linear(n, n) per layer)
    assert split["params"]["n_total"] == split["params"]["n1"] + dense_cfg.n_layer * (4 * dense_cfg.d_model + 4 * 4)
    scratch = report(dense_cfg, dense_sd, "scratch")
    assert scratch["reinit_fraction"] == {"gate": 1.0, "up": 1.0, "down": 1.0}
    assert scratch["intact_neuron_fraction"] == 0.0 and scratch["max_abs_logit_diff"] > 0.1
