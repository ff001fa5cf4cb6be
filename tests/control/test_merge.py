"""An extension's spec (control/sweeps.py `merge`) validates: token budget lists come out ascending wherever the added
budgets land (below the smallest, between two, above the largest), while lists whose order names the grid's axes
(sizes, methods) keep it. Checked on the merged dict with the real spec parser, on what `suggest` weighs (its
candidates, min / 2 among them), and through `extend` on a real SQLite store.
"""

from __future__ import annotations

import pytest

from upscale.control.suggest import candidates
from upscale.control.sweeps import extend, merge, submit
from upscale.sweeps.spec import parse_spec

GRID = {
    "name": "merge-test",
    "model": {"sizes": [{"n_layer": 1, "d_model": 32, "n_head": 2}, {"n_layer": 1, "d_model": 16, "n_head": 2}]},
    "moe": {"experts": [4], "topk": [2]},
    "upcycling": {"methods": ["naive", "drop"]},
    "tokens": {"d1": [2048, 8192], "d2": [1024, 4096], "scratch": [2048, 8192]},
    "train": {"context": 16, "batch_size": 8, "lr": {"dense": 3.0e-3, "moe": 2.0e-3}, "warmup_tokens": 256},
    "per_size": {"L1-d16-h2": {"tokens": {"d2": [2048, 8192]}}},
    "data": {"corpus": "builtin:python-stdlib", "tokenizer": "bytes", "eval_tokens": 2048},
    "resources": {"cpus": 1},
}
# below the smallest, between two, above the largest, and one already there
ADDITIONS = {"tokens": {"d1": [16384, 4096, 1024, 2048], "d2": [512, 2048], "scratch": [4096]},
             "model": {"sizes": [{"n_layer": 1, "d_model": 24, "n_head": 2}]},
             "per_size": {"L1-d16-h2": {"tokens": {"d2": [1024, 4096, 16384]}}},
             "upcycling": {"methods": ["noise"]}}


def test_merged_budgets_are_sorted_and_axes_keep_their_order() -> None:
    merged = merge(GRID, ADDITIONS)
    spec = parse_spec(merged)  # SpecError ("budgets must be sorted ascending") before the fix
    assert spec.tokens.d1 == [1024, 2048, 4096, 8192, 16384]
    assert spec.tokens.d2 == [512, 1024, 2048, 4096] and spec.tokens.scratch == [2048, 4096, 8192]
    assert merged["per_size"]["L1-d16-h2"]["tokens"]["d2"] == [1024, 2048, 4096, 8192, 16384]
    assert [s["d_model"] for s in merged["model"]["sizes"]] == [32, 16, 24]  # appended, not sorted
    assert merged["upcycling"]["methods"] == ["naive", "drop", "noise"]
    assert GRID["tokens"]["d1"] == [2048, 8192]  # the base is not modified


def test_every_candidate_suggest_weighs_merges_into_a_valid_spec() -> None:
    spec = parse_spec(GRID)
    weighed = candidates(spec)
    assert any(c.additions.get("tokens", {}).get("d1") == [1024.0] for c in weighed)  # min / 2: below the smallest
    for c in weighed:
        merged = parse_spec(merge(GRID, c.additions))
        for name in ("d1", "d2", "scratch"):
            values = getattr(merged.tokens, name)
            assert values == sorted(values), (c.description, name, values)


@pytest.fixture()
def services(tmp_path, settings):
    from upscale.control.wiring import open_services

    return open_services(settings, auth=False)


def test_extend_records_the_sorted_spec(services) -> None:
    sweep_id = submit(services, parse_spec(GRID), "alice", new=True).id
    created = extend(services, sweep_id, {"tokens": {"d1": [1024, 4096, 16384]}}, "alice")
    assert services.store.sweep(created.id).spec["tokens"]["d1"] == [1024, 2048, 4096, 8192, 16384]
