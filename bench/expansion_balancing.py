"""Loss-free against aux-loss balancing on the expansion grid: load imbalance and loss, arm against arm.

Both arms are bench/data/expansion_grid.yaml under `routing: deepspeed` (top-1 with softmax_topk refuses loss-free
balancing: the router would get no gradient), one with `balancing: aux_loss`, one with `loss_free`; each trained in
its own home, so that nothing but the balancing differs (the dense trunks are retrained alike in both):

    UPSCALE_HOME=H_AUX upscale run bench/data/expansion_grid_aux_loss.yaml --max-concurrent 1
    UPSCALE_HOME=H_LF upscale run bench/data/expansion_grid_loss_free.yaml --max-concurrent 1
    .venv/bin/python bench/expansion_balancing.py H_AUX H_LF --json bench/data/expansion_balancing.json

Read from the two stores: every MoE decay (the 4x1 parent's and the 8x1 rival's from-scratch decays, the upcycled
4x1 and the expanded 8x1), matched across the arms by its observation's coordinates. Per decay: its validation loss
and its load imbalance (max/mean expert load on the training batches, mean over layers; averaged over the decay's
logged steps, from its MLflow history). Reported per kind: the mean imbalance of each arm, and loss_free / aux_loss
for the imbalance and the loss (geometric means over the matched decays).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from upscale.control.wiring import open_services
from upscale.orchestrator.settings import Settings

ARMS = ("aux_loss", "loss_free")
IMBALANCE = "moe/load_max_over_mean"
AXES = ("kind", "N1", "D1", "D2", "D", "n_expert", "topk", "method")


def _label(o: dict[str, Any]) -> str:
    """What a decay is: `expanded 4x1->8x1`, `upcycled 4x1`, `scratch 8x1`."""
    shape = f"{o['n_expert']}x{o['topk']}"
    if o["kind"] == "expanded":
        return f"expanded {o['parent_experts']}x{o['topk']}->{shape}"
    return f"{o['kind']} {shape}"


def decays(home: Path) -> dict[tuple, dict[str, Any]]:
    """Every finished MoE decay of the home's one sweep: coordinates -> {label, val_loss, imbalance}."""
    settings = Settings(home=home)
    services = open_services(settings)
    (sweep,) = services.store.sweeps()
    client = MlflowClient(settings.mlflow_tracking_uri)
    out = {}
    for seg, _ in services.store.members(sweep.id):
        o = seg.observation
        if seg.status != "done" or o is None or o["kind"] == "dense":
            continue
        history = [m.value for m in client.get_metric_history(seg.mlflow_run_id, IMBALANCE)]
        out[tuple(o.get(a) for a in AXES)] = {"label": _label(o), "val_loss": seg.result["val_loss"],
                                              "imbalance": statistics.fmean(history) if history else math.nan}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("aux_home", type=Path, help="UPSCALE_HOME of the aux_loss arm's sweep")
    ap.add_argument("loss_free_home", type=Path, help="UPSCALE_HOME of the loss_free arm's sweep")
    ap.add_argument("--json", type=Path, help="also write the matched decays and the figures here")
    args = ap.parse_args()
    arms = {"aux_loss": decays(args.aux_home), "loss_free": decays(args.loss_free_home)}
    matched = sorted(set(arms["aux_loss"]) & set(arms["loss_free"]), key=str)
    by_label: dict[str, list[tuple]] = {}
    for key in matched:
        by_label.setdefault(arms["aux_loss"][key]["label"], []).append(key)
    print(f"{len(matched)} MoE decays matched ({len(arms['aux_loss'])} aux_loss, {len(arms['loss_free'])} loss_free)")
    print(f"{'decays':<22} {'n':>3} {'imbalance aux':>14} {'imbalance free':>15} {'ratio':>6} {'loss ratio':>11}")
    figures = {}
    for label, keys in sorted(by_label.items()):
        imb = {arm: statistics.fmean(arms[arm][k]["imbalance"] for k in keys) for arm in ARMS}
        ratio = {q: math.exp(statistics.fmean(math.log(arms["loss_free"][k][q] / arms["aux_loss"][k][q])
                                              for k in keys)) for q in ("imbalance", "val_loss")}
        figures[label] = {"n": len(keys), "imbalance": imb, "ratio": ratio}
        print(f"{label:<22} {len(keys):>3} {imb['aux_loss']:>14.3f} {imb['loss_free']:>15.3f} "
              f"{ratio['imbalance']:>6.3f} {ratio['val_loss']:>11.4f}")
    print("ratio: loss_free / aux_loss (geometric mean over the matched decays)")
    if args.json:
        rows = [{**dict(zip(AXES, key, strict=True)), **{arm: arms[arm][key] for arm in ARMS}} for key in matched]
        args.json.write_text(json.dumps({"figures": figures, "decays": rows}, indent=1))


if __name__ == "__main__":
    main()
