"""Which laws a planned grid identifies: the example specs, a deliberately small grid, following the suggestions, and
the warnings `upscale plan` prints and puts in its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from upscale.api.cli import app
from upscale.control.identifiability import planned_grid
from upscale.fitting.identifiability import Grid, LawCheck, identifiability
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan
from upscale.sweeps.spec import parse_spec

EXAMPLES = Path(__file__).parents[2] / "sweeps" / "examples"
# One dense size, one D1, two D2, no from-scratch budgets: what the issue tried.
SMALL = {
    "name": "one-size-two-points",
    "model": {"sizes": ["nano"]},
    "moe": {"experts": [4], "topk": [1]},
    "upcycling": {"methods": ["naive"]},
    "tokens": {"d1": [512], "d2": [256, 512]},
    "train": {"context": 16, "batch_size": 4, "lr": {"dense": 3e-3, "moe": 2e-3}, "warmup_tokens": 64},
}


def checks_of(spec) -> dict[tuple[str, str], LawCheck]:
    return {(c.law, c.fit.split(" ")[0]): c for c in identifiability(planned_grid(plan(spec)))}


def test_grids_with_enough_sizes_and_budgets_identify_every_law() -> None:
    for name in ("demo.yaml", "liew-joint.yaml"):
        checks = identifiability(planned_grid(plan(load_spec(EXAMPLES / name))))
        assert {c.law for c in checks} == {"chinchilla", "joint", "data-mul", "D*"}
        assert all(c.identifiable and not c.unidentified and not c.add for c in checks), name


def test_one_dense_size_cannot_identify_the_n_terms() -> None:
    """drop-r.yaml trains one size: the N1 term of the joint law (E fixed, as the analysis fits it) is one constant
    whose B and beta cannot be told apart (a second size separates them), and the N term of Chinchilla cannot be
    told from E; the data law (D1, D2 only) is fine; D* needs both, so it is not identifiable."""
    checks = checks_of(load_spec(EXAMPLES / "drop-r.yaml"))
    joint = checks[("joint", "upcycled")]
    assert not joint.identifiable and set(joint.unidentified) == {"upcycled.B", "upcycled.beta"}
    assert "N1 takes 1 value" in joint.reason and joint.add == "add 1 more dense size (model.sizes)"
    scratch = checks[("chinchilla", "from-scratch")]
    assert not scratch.identifiable and {"scratch.B", "scratch.beta"} <= set(scratch.unidentified)
    assert checks[("data-mul", "upcycled")].identifiable
    assert not checks[("D*", "chinchilla")].identifiable
    # liew-data-grid.yaml has no from-scratch budgets at all
    grid_checks = checks_of(load_spec(EXAMPLES / "liew-data-grid.yaml"))
    no_moe = grid_checks[("chinchilla", "from-scratch")]
    assert not no_moe.identifiable and "no from-scratch budgets" in no_moe.reason and "tokens.scratch" in no_moe.add
    assert "from-scratch MoE law" in grid_checks[("D*", "chinchilla")].reason


def test_two_points_cannot_identify_the_data_law_and_the_suggestion_fixes_it() -> None:
    checks = checks_of(parse_spec(SMALL))
    data = checks[("data-mul", "upcycled")]
    assert not data.identifiable and "2 points for 5 parameters" in data.reason and "D1 takes 1 value" in data.reason
    assert set(data.unidentified) == {f"upcycled.{p}" for p in ("A", "alpha1", "alpha2", "alpha3", "E")}
    assert data.add == "add 2 more D1 budgets (tokens.d1)"
    assert not any(c.identifiable for c in checks.values())
    grown = {**SMALL, "tokens": {"d1": [512, 1024, 2048], "d2": [256, 512]}}  # what it said to add
    assert checks_of(parse_spec(grown))[("data-mul", "upcycled")].identifiable


def test_as_many_points_as_parameters_is_not_enough() -> None:
    """Five (D1, D2) points for the data law's five parameters: full rank, but the fit would interpolate."""
    rows = ((1.0, 1e6, 1e6), (1.0, 2e6, 1e6), (1.0, 4e6, 1e6), (1.0, 1e6, 2e6), (1.0, 2e6, 4e6))
    grid = Grid(dense=((1.0, 1e6),), scratch=(), upcycled={"naive 4x1": rows})
    data = next(c for c in identifiability(grid) if c.law == "data-mul")
    assert not data.identifiable and data.unidentified == () and "5 points for 5 parameters" in data.reason


def test_plan_prints_the_warnings_and_puts_them_in_its_json(tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    runner = CliRunner()
    text = runner.invoke(app, ["plan", str(path)], catch_exceptions=False)
    assert text.exit_code == 0
    flat = " ".join(text.stdout.split())
    assert "warning: data-mul on upcycled naive 4x1" in flat and "add 2 more D1 budgets (tokens.d1)" in flat
    out = runner.invoke(app, ["plan", str(path), "--json"], catch_exceptions=False)
    entries = json.loads(out.stdout)["identifiability"]
    assert {e["law"] for e in entries} == {"chinchilla", "joint", "data-mul", "D*"}
    assert not any(e["identifiable"] for e in entries)
    assert all(e["reason"] and e["add"] for e in entries)
