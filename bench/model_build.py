"""Model construction: `build_model` (meta-device build, one allocation, draws on parallel threads) against the path it
replaced, kept here verbatim as the baseline (`legacy_build`: modules built on the device with their default inits,
DeepSpeed deep-copying each expert, then every parameter drawn again on one thread). The baseline builds today's
`UpscaleLM`, whose embedding no longer draws a default init that was overwritten anyway: it is that one draw
(vocabulary x d_model normals, about 0.2 s at 0.1B on one core) faster than the code it stands for.

Both run in the same process, interleaved `--repeats` times (order alternating), on the sizes the paper's grids
train (`sweeps/examples/liew-*.yaml`: vocabulary 32,000, context 1024): 0.1B dense and its 8x2 MoE by default.
Each figure is the median seconds of one construction (DeepSpeed imported beforehand), wall-clock and process CPU
time over all threads (what other jobs on a shared machine do not distort); the ratios are legacy / ours. The two
models' state dicts are compared bit for bit at every size (`identical`).

    .venv/bin/python bench/model_build.py                          # 0.1B dense and 8x2, torch's default threads
    .venv/bin/python bench/model_build.py --sizes 0.2B --threads 2
    .venv/bin/python bench/model_build.py --device cuda --sizes 0.1B 0.5B
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time

import torch

from upscale.workers.model import ModelConfig, MoEFFN, UpscaleLM, build_model, init_router, seeded_generator


def legacy_build(cfg: ModelConfig, seed: int, device: str = "cpu") -> UpscaleLM:
    """`build_model` as it was before the meta-device build (the baseline, and the reference its weights must
    equal)."""
    device = torch.device(device)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        model = UpscaleLM(cfg)
    out_std = cfg.init_std / math.sqrt(2 * cfg.n_layer)
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            if ".gate.wg." in name or name.endswith("norm.weight"):
                continue
            std = out_std if name.endswith(("wo.weight", "w_down.weight")) else cfg.init_std
            p.copy_(torch.randn(p.shape, generator=seeded_generator(seed, 0, i)) * std)
        for layer, block in enumerate(model.blocks):
            if isinstance(block.ffn, MoEFFN):
                wg = block.ffn.moe.deepspeed_moe.gate.wg
                fresh = init_router(cfg, seeded_generator(seed, 1, layer))
                for name, p in wg.named_parameters():
                    p.copy_(fresh[name])
    return model


def timed(build, cfg: ModelConfig, device: str) -> tuple[tuple[float, float], dict[str, torch.Tensor]]:
    """(wall-clock s, process CPU s over all threads) of one construction, and the model's state dict."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    model = build(cfg, 0, device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - wall, time.process_time() - cpu), model.state_dict()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["0.1B"], help="sizes from sweeps/sizes.py")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    ap.add_argument("--device", default="cpu", help="where the model is built (cuda: draws on the CPU, then copied)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    build_model(ModelConfig.from_size("tiny", n_expert=2, topk=1), 0)  # imports DeepSpeed outside the clock
    print(f"{args.device}, {torch.get_num_threads()} torch threads; median of {args.repeats}")
    for size in args.sizes:
        dense = ModelConfig.from_size(size, vocab_size=32000, context=1024)
        for label, cfg in ((f"{size} dense", dense), (f"{size} 8x2", dense.updated(n_expert=8, topk=2))):
            ours, legacy, identical = [], [], True
            for r in range(args.repeats):  # order alternating, so load from other processes hits both alike
                if r % 2:
                    old_s, old_sd = timed(legacy_build, cfg, args.device)
                    new_s, new_sd = timed(build_model, cfg, args.device)
                else:
                    new_s, new_sd = timed(build_model, cfg, args.device)
                    old_s, old_sd = timed(legacy_build, cfg, args.device)
                ours.append(new_s)
                legacy.append(old_s)
                identical &= new_sd.keys() == old_sd.keys() and all(torch.equal(v, old_sd[k])
                                                                    for k, v in new_sd.items())
                del new_sd, old_sd
            (wall, cpu), (old_wall, old_cpu) = (tuple(map(statistics.median, zip(*t, strict=True)))
                                                for t in (ours, legacy))
            print(f"{label:12s} build_model {wall:6.2f} s (CPU {cpu:6.2f} s)   legacy {old_wall:6.2f} s "
                  f"(CPU {old_cpu:6.2f} s)   speed-up {old_wall / wall:4.1f}x wall, {old_cpu / cpu:4.1f}x CPU   "
                  f"identical {identical}", flush=True)


if __name__ == "__main__":
    main()
