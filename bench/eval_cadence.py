"""What the demo's validation cadence (`train.eval_every_tokens`) costs: its trunk pieces trained with it against the
same pieces without it, same run.

Periodic validations fall on trunk pieces almost only (a decay is 10% of its budget, an upcycle does not train), so
the first trunk piece of every model of sweeps/examples/demo.yaml (per size: the dense trunk and the from-scratch MoE
trunk, which needs no parent) is the worst case for the whole sweep: ours is the pieces' summed worker wall time
(`SegmentResult.wall_s`) with the spec's cadence, the baseline the same with validation at each piece's start and end
only. Also printed: how many validations the cadence adds over the whole plan, and the points per trunk piece.

    .venv/bin/python bench/eval_cadence.py [--spec sweeps/examples/demo.yaml] [--repeats 2]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from upscale.orchestrator.scheduler import step_options
from upscale.sweeps.loader import DEMO_SPEC, load_spec
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import BUILD_KINDS, TRUNK_KINDS, SegmentRuntime
from upscale.workers.segment import run_segment


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=DEMO_SPEC)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each piece each way; the fastest counts")
    args = ap.parse_args()
    spec = load_spec(args.spec)
    stored = spec.model_dump(mode="json")
    planned = plan(spec)
    added, pieces, shown = 0, [], set()
    for seg in planned.segments:
        every = step_options(stored, seg.axes["size"])["eval_every_tokens"]
        if every is None:
            raise SystemExit(f"{args.spec} sets no train.eval_every_tokens")
        if seg.spec.kind in BUILD_KINDS | {"dense_import", "lr_search"}:
            continue
        inside = range(seg.spec.start_tokens + every - seg.spec.start_tokens % every, seg.spec.end_tokens, every)
        added += len(inside)
        piece = (seg.spec.kind, seg.axes["size"], seg.spec.start_tokens, seg.spec.end_tokens)
        if seg.spec.kind in TRUNK_KINDS and piece not in shown:  # the MoE trunks of each variant are alike
            shown.add(piece)
            print(f"{seg.spec.kind:13s} {seg.axes['size']:7s} tokens {seg.spec.start_tokens}-{seg.spec.end_tokens}: "
                  f"{len(inside) + 2} points")
        if seg.spec.kind in ("dense_trunk", "scratch_trunk") and seg.spec.start_tokens == 0:
            pieces.append((seg, every))
    print(f"the cadence adds {added} validations of {spec.data.eval_tokens} tokens to the plan's "
          f"{len(planned.segments)} segments")
    walls = {"baseline (start and end)": 0.0, "ours (with the cadence)": 0.0}
    with tempfile.TemporaryDirectory(prefix="upscale-cadence-") as tmp:
        for n, (seg, every) in enumerate(pieces):
            for name, cadence in zip(walls, (None, every), strict=True):
                best = min(run_segment(seg.spec, SegmentRuntime(
                    checkpoint_dir=f"{tmp}/{n}-{cadence}-{r}", data_cache_dir=f"{tmp}/cache",
                    eval_every_tokens=cadence)).wall_s for r in range(args.repeats))
                walls[name] += best
                print(f"{seg.spec.kind} {seg.axes['size']} {name}: {best:.2f} s")
    base, ours = walls.values()
    print(f"first trunk pieces, summed: baseline {base:.1f} s, ours {ours:.1f} s: x{ours / base:.3f} "
          f"(+{100 * (ours / base - 1):.1f}%)")


if __name__ == "__main__":
    main()
