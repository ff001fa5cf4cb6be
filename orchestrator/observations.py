"""A sweep's observations as the table `upscale fit` reads (fitting/laws.py column names).

Column meanings follow docs/laws.md: dense rows carry D = D1 and N = N1 (the Chinchilla law); from-scratch MoE rows
carry D and N = N1, the size of the dense model the MoE is built on, as the paper fits the MoE law
(fitting/synthetic.py); upcycled rows carry D1, D2, N1 for the data and joint laws, and N2 and P = N_total / N2 for the
config laws. Expanded rows (an E-expert MoE grown to n_expert = m·E experts) carry D1 (the parent's tokens), D2, N1,
N2, P and parent_experts = E: `analyze` reads them as expansion studies (fitting/expansion.py). Every row has
its `trunk`, so the bootstrap resamples trunks, and its MLflow run.
"""

from __future__ import annotations

import pandas as pd

from upscale.orchestrator.records import ObservationRecord

COLUMNS = ("kind", "N", "D", "N1", "D1", "D2", "N2", "P", "n_expert", "topk", "parent_experts", "method", "r", "loss",
           "trunk", "segment", "mlflow_run_id")
# What `upscale run --json` prints per observation (the contract).
JSON_FIELDS = ("kind", "N1", "D1", "D2", "D", "n_expert", "topk", "parent_experts", "method", "r", "loss", "trunk")


def as_row(o: ObservationRecord) -> dict[str, object]:
    chinchilla = o.kind in ("dense", "scratch")
    return {
        "kind": o.kind, "N": o.N1 if chinchilla else None, "D": o.D if chinchilla else None, "N1": o.N1,
        "D1": o.D1, "D2": o.D2, "N2": o.N2, "P": o.N_total / o.N2 if o.N_total and o.N2 else None,
        "n_expert": o.n_expert, "topk": o.topk, "parent_experts": o.parent_experts, "method": o.method, "r": o.r,
        "loss": o.loss, "trunk": o.trunk,
        "segment": o.segment_key, "mlflow_run_id": o.mlflow_run_id,
    }


def table(observations: list[ObservationRecord], kind: str | None = None) -> pd.DataFrame:
    """One row per observation (optionally of one kind), nullable integer columns for counts."""
    rows = [as_row(o) for o in observations if kind is None or o.kind == kind]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for c in ("N", "D", "N1", "D1", "D2", "N2", "n_expert", "topk", "parent_experts"):
        df[c] = df[c].astype("Int64")
    return df
