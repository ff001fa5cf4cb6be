"""Upcycling methods on a `tiny` dense model: time to upcycle and what each method preserves.

Usage: `.venv/bin/python bench/upcycle_report.py` (also run by `make bench`).

One dense `tiny` model (4 layers, d_model 128, d_ff 512, byte vocabulary, context 128) is upcycled into an 8-expert
top-2 MoE by every method. For each: the fastest wall time of `workers.upcycling.upcycle` over 3 runs, as a ratio
to naive copying measured in the same run (the baseline: the cheapest possible upcycling, pure tensor copies; a
ratio of 5 means the method costs 5 naive upcyclings), and the report of `upscale upcycle` (max |dense - MoE|
logit on a fixed batch in fp32, re-initialised neuron fractions, intact neurons, distinct experts, N2, N_total).
The data-driven methods get 32 sequences of 128 bytes of Python stdlib source as calibration data.
llama-moe sharing-inter uses 7 routed + 1 residual experts (8 + 1 parts do not divide d_ff = 512).
"""

from __future__ import annotations

import textwrap
import time

import torch

from upscale.workers.model import ModelConfig, build_model
from upscale.workers.upcycling import method_spec, upcycle
from upscale.workers.upcycling.calibration import load_calibration
from upscale.workers.upcycling.report import upcycle_report

CASES: list[tuple[str, dict[str, object], int]] = [
    ("naive", {}, 8),
    ("drop", {"r": 0.5}, 8),
    ("drop", {"r": 0.5, "index_mode": "per_matrix"}, 8),
    ("drop", {"r": 0.0}, 8),
    ("noise", {}, 8),
    ("noise", {"noise_variant": "add_neuronwise"}, 8),
    ("llama-moe", {"split": "independent-random"}, 8),
    ("llama-moe", {"split": "independent-clustering"}, 8),
    ("llama-moe", {"split": "sharing-inner"}, 8),
    ("llama-moe", {"split": "sharing-inter"}, 7),
    ("router-upcycling", {}, 8),
    ("granular", {"granularity": 2}, 8),
    ("scratch", {}, 8),
]


def timed(fn, repeats: int = 3) -> tuple[float, object]:
    """Fastest of `repeats` runs: the least disturbed by other processes on shared cores."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    torch.set_num_threads(1)
    dense_cfg = ModelConfig.from_size("tiny", vocab_size=256, context=128)
    dense_sd = build_model(dense_cfg, seed=0).state_dict()
    tokens = load_calibration(textwrap.__file__, dense_cfg, seq_len=128, max_seqs=32)
    upcycle(dense_sd, dense_cfg.updated(n_expert=8, topk=2), method_spec("naive"))  # warm-up: DeepSpeed import
    rows, base = [], None
    for method, opts, n in CASES:
        spec = method_spec(method, **opts)
        moe_cfg = dense_cfg.updated(n_expert=n, topk=2)
        seconds, (cfg, sd) = timed(lambda spec=spec, moe_cfg=moe_cfg: upcycle(dense_sd, moe_cfg, spec, tokens))
        base = seconds if base is None else base
        rows.append((method, opts, cfg, seconds, upcycle_report(spec, dense_cfg, dense_sd, cfg, sd)))
    print(f"dense tiny: N1 = {rows[0][4]['params']['n1']:,}; 8 experts top-2; torch threads 1; "
          f"baseline naive = {base * 1e3:.1f} ms\n")
    print("| method | options | upcycle ms | × naive | max abs logit diff | reinit gate/up/down | intact | distinct "
          "| N2 | N_total |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: |")
    for method, opts, cfg, seconds, r in rows:
        options = ", ".join(f"{k}={v}" for k, v in opts.items()) + (f" ({cfg.n_expert} experts)" if cfg.n_expert != 8
                                                                      else "")
        rf = r["reinit_fraction"]
        print(f"| {method} | {options or '—'} | {seconds * 1e3:.1f} | {seconds / base:.2f} | "
              f"{r['max_abs_logit_diff']:.2e} | {rf['gate']:.3f}/{rf['up']:.3f}/{rf['down']:.3f} | "
              f"{r['intact_neuron_fraction']:.3f} | {r['experts_distinct']} | {r['params']['n2']:,} | "
              f"{r['params']['n_total']:,} |")


if __name__ == "__main__":
    main()
