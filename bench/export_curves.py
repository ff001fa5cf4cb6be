"""Train the demo sweep for real and export it as one dataset for replaying designs offline: bench/data/demo_grid.json.

Runs sweeps/examples/demo.yaml (validation every 16 steps: `train.eval_every_tokens`) on embedded Ray in an
UPSCALE_HOME of its own, as `upscale run` does (a temporary one, or ``--home``: a home whose identical sweep is done
is read, not trained again), then writes:

- ``observations``: every decay's end loss at its grid coordinates (kind, N1, D1, D2, D, N2, N_total, n_expert,
  topk, method, r, loss, trunk, segment_key), as the store records them;
- ``trunks``: every trunk as `control.curves.sweep_curves` serves it (its validation curve, LR multiplier per step,
  tokens per step, peak LR, done decay branches with their curves and schedules, interior points);
- ``segments``: the plan of the spec (`sweeps.planner.plan`), each segment's kind, planned FLOPs and tokens, parents,
  start and end tokens, trunk and planned observation, so that a replay charges the marginal FLOPs of the DAG a set
  of observations needs, as bench/active_design.py's ``Dag`` does.

    .venv/bin/python bench/export_curves.py [--spec sweeps/examples/demo.yaml] [--home DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

from upscale.control.curves import OBSERVATION_FIELDS, sweep_curves
from upscale.control.runs import run_spec
from upscale.control.wiring import open_services
from upscale.orchestrator.settings import Settings
from upscale.sweeps.loader import DEMO_SPEC, load_spec

OUT = Path(__file__).resolve().parent / "data" / "demo_grid.json"


def export(spec_path: Path, home: Path, out: Path) -> None:
    spec = load_spec(spec_path)
    services = open_services(Settings(home=home), auth=False)
    t0 = time.perf_counter()
    outcome, planned = run_spec(services, spec)  # a done identical sweep is returned as it is, not trained again
    if outcome.status != "done":
        raise SystemExit(f"sweep {outcome.sweep_id} ended {outcome.status}: see `UPSCALE_HOME={home} upscale "
                         f"status {outcome.sweep_id}`")
    if outcome.trained:
        print(f"trained sweep {outcome.sweep_id} in {time.perf_counter() - t0:.0f} s")
    sweep_id = outcome.sweep_id
    observations = [{f: getattr(o, f) for f in (*OBSERVATION_FIELDS, "trunk", "segment_key")}
                    for o in services.store.observations(sweep_id)]
    segments = [{"key": s.id, "kind": s.spec.kind, "flops": s.flops, "tokens": s.tokens,
                 "parents": list(s.spec.parent_ids), "start_tokens": s.spec.start_tokens,
                 "end_tokens": s.spec.end_tokens, "trunk": s.trunk,
                 "observation": dataclasses.asdict(s.observation) if s.observation else None}
                for s in planned.segments]
    trunks = [dataclasses.asdict(t) for t in sweep_curves(services, [sweep_id])]
    data = {"spec": str(spec_path.name), "sweep": spec.name, "total_flops": planned.total_flops,
            "observations": observations, "trunks": trunks, "segments": segments}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    points = sum(len(t["curve"]) for t in trunks)
    print(f"{out}: {len(observations)} observations, {len(trunks)} trunks ({points} trunk points, "
          f"{sum(len(t['interior']) for t in trunks)} interior), {len(segments)} segments, "
          f"{out.stat().st_size / 1024:.0f} KiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=DEMO_SPEC)
    ap.add_argument("--home", type=Path, help="UPSCALE_HOME to train in and keep (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.home is not None:
        export(args.spec, args.home, args.out)
        return
    with tempfile.TemporaryDirectory(prefix="upscale-export-") as home:
        export(args.spec, Path(home), args.out)


if __name__ == "__main__":
    main()
