"""SYNTHETIC expert-upcycling tables from the paper's family (fitting/synthetic.py), relabelled: the dense law's
rows as the 4x1 parent's from-scratch runs, the MoE law's as the 8x1 MoE's and the upcycled law's as the rows
expanded from 4x1 to 8x1, so that D*_expand is the generating laws' D*."""

from __future__ import annotations

import numpy as np
import pandas as pd

from upscale.fitting.laws import get_law
from upscale.fitting.summary import FittedLaw
from upscale.fitting.synthetic import N1_TABLE3, TABLE2, design, generate

SIZES = N1_TABLE3[2:]
GRID = {"N": SIZES, "N1": SIZES, "D": tuple(np.geomspace(1e8, 1e13, 8)), "D1": tuple(np.geomspace(5e8, 3.2e10, 4)),
        "D2": tuple(np.geomspace(5e8, 3.2e10, 5))}
PARENT, CHILD, TOPK = 4, 8, 1


def truth() -> tuple[FittedLaw, FittedLaw]:
    """The generating laws: the 8x1 MoE from scratch and the expanded one."""
    return FittedLaw(get_law("chinchilla"), TABLE2["moe"]), FittedLaw(get_law("joint"), TABLE2["upcycled"])


def expansion_tables(seed: int = 7) -> dict[str, pd.DataFrame]:
    """"scratch" (the 4x1 parent's and the 8x1 MoE's runs) and "expanded" (4x1 -> 8x1, uniform)."""
    chin, joint = get_law("chinchilla"), get_law("joint")
    parent = generate(chin, TABLE2["dense"], design(chin, GRID), 0.003, 0.003, seed).assign(
        n_expert=PARENT, topk=TOPK, trunk=lambda d: "parent-" + d["trunk"])
    child = generate(chin, TABLE2["moe"], design(chin, GRID), 0.003, 0.003, seed + 1).assign(
        n_expert=CHILD, topk=TOPK, trunk=lambda d: "child-" + d["trunk"])
    expanded = generate(joint, TABLE2["upcycled"], design(joint, GRID), 0.003, 0.003, seed + 2).assign(
        parent_experts=PARENT, n_expert=CHILD, topk=TOPK, method="expand-uniform", r=None)
    return {"scratch": pd.concat([parent, child], ignore_index=True), "expanded": expanded}


def with_upcycling(seed: int = 7) -> dict[str, pd.DataFrame]:
    """The expansion tables beside an ordinary dense->8x1 upcycling study (its dense and upcycled tables), as one
    sweep holding both would give them."""
    chin, joint = get_law("chinchilla"), get_law("joint")
    tables = expansion_tables(seed)
    dense = generate(chin, TABLE2["dense"], design(chin, GRID), 0.003, 0.003, seed + 3)
    upcycled = generate(joint, TABLE2["upcycled"], design(joint, GRID), 0.003, 0.003, seed + 4).assign(
        method="naive", r=None, n_expert=CHILD, topk=TOPK)
    return {"dense": dense, "upcycled": upcycled, **tables}
