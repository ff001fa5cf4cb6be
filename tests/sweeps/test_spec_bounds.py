"""Reading a spec is bounded: `segment_bound` counts the plan from the axes (exact when nothing is shared, never
below it), `max_segments` refuses before the grid-wide checks, YAML aliases and deep or over-large values are refused
with their paths (through `load_spec`, the CLI's reader, too), and an error is small whatever it quotes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.sweeps.conftest import SMALL_SPEC
from upscale.sweeps.errors import MAX_PROBLEMS
from upscale.sweeps.loader import load_spec, parse_document
from upscale.sweeps.planner import plan
from upscale.sweeps.spec import SpecError, excerpt, parse_spec, segment_bound

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "sweeps" / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_bound_is_never_below_the_plan(path: Path) -> None:
    spec = load_spec(path)
    assert segment_bound(spec) >= len(plan(spec).segments)


@pytest.mark.parametrize("change", [
    {},
    {"moe": {"experts": [2, 4], "topk": [1, 2]},
     "upcycling": {"methods": ["naive", "drop", "noise"], "r": [0.25, 0.5]}},
    {"tokens": {"d1": [20480, 40960], "d2": [20480], "scratch": [20480, 40960, 61440]}},
    {"train": {**SMALL_SPEC["train"], "lr": None, "lr_search": {"trials": 2, "low": 1e-4, "high": 1e-2,
                                                                 "tokens": 20480}}},
    {"model": {"sizes": ["nano", "micro"]}, "per_size": {"micro": {"tokens": {"d2": [40960]}}}},
], ids=["small", "grid", "scratch", "lr_search", "per_size"])
def test_the_bound_is_exact_when_nothing_is_shared(change: dict) -> None:
    spec = parse_spec({**copy.deepcopy(SMALL_SPEC), **change})
    assert segment_bound(spec) == len(plan(spec).segments)


def test_max_segments_refuses_a_grid_with_its_count() -> None:
    data = {**SMALL_SPEC, "moe": {"experts": list(range(2, 1002)), "topk": [1, 2]},
            "upcycling": {"methods": ["naive", "drop"], "r": [i / 1000 for i in range(1000)]}}
    with pytest.raises(SpecError) as e:
        parse_spec(data, max_segments=20000)
    (problem,) = e.value.problems
    assert "UPSCALE_MAX_SEGMENTS" in problem[1] and "20,000" in problem[1]
    n = segment_bound(parse_spec(SMALL_SPEC))
    assert parse_spec(SMALL_SPEC, max_segments=n) == parse_spec(SMALL_SPEC)
    with pytest.raises(SpecError, match=f"up to {n} segments"):
        parse_spec(SMALL_SPEC, max_segments=n - 1)


def test_an_axis_over_its_cap_is_refused() -> None:
    with pytest.raises(SpecError) as e:
        parse_spec({**SMALL_SPEC, "tokens": {"d1": [2048.0 * (i + 1) for i in range(1001)], "d2": [20480]}})
    assert [p for p, _ in e.value.problems] == ["tokens.d1"]


def test_load_spec_refuses_yaml_aliases(tmp_path: Path) -> None:
    path = tmp_path / "alias.yaml"
    path.write_text("name: a\nmodel: &m {sizes: [nano]}\nother: *m\n")
    with pytest.raises(SpecError, match="YAML aliases are not allowed in a spec \\(line 3\\)"):
        load_spec(path)


def test_depth_and_integers_are_checked_with_paths() -> None:
    with pytest.raises(SpecError) as e:
        parse_document('{"a": {"b": [1, 2, 99999999999999999999]}, "c": ' + "[" * 70 + "]" * 70 + "}", "json")
    assert sorted(p for p, _ in e.value.problems) == ["a.b[2]", "c" + "[0]" * 64]
    with pytest.raises(SpecError, match="deeper than 64"):
        parse_document("a:\n" + "".join(f"{' ' * i}- \n" for i in range(1, 3000)), "yaml")


def test_errors_stay_small() -> None:
    assert excerpt("x" * 1000) == repr("x" * 1000)[:79] + "…" and len(excerpt("x" * 1000)) == 80
    assert excerpt(list(range(10**6))) == "<list of 1000000 entries>"
    e = SpecError([(f"f{i}", "m" * 10_000) for i in range(500)])
    assert len(e.problems) == MAX_PROBLEMS + 1 and e.problems[-1][1] == f"... and {500 - MAX_PROBLEMS} more problems"
    assert len(str(e)) < 30_000
