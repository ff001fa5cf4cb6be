"""Expert upcycling: expanded rows split into studies mapped onto the three tables, D*_expand found with an interval
that covers the generating laws' D*, a study lacking an arm kept with what to add, and the dense->MoE answer
untouched by expanded rows."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.fitting.expansion_tables import CHILD, PARENT, SIZES, expansion_tables, truth, with_upcycling
from upscale.fitting.analysis import Analysis, analyze
from upscale.fitting.display import dstar, summary_lines
from upscale.fitting.dstar import dstar_at
from upscale.fitting.errors import FitError
from upscale.fitting.expansion import expansion_studies, study_label, upcycling_scratch

EMPTY = {"dense": pd.DataFrame(columns=["N", "D", "loss"]),
         "upcycled": pd.DataFrame(columns=["N1", "D1", "D2", "loss"])}


def test_a_study_maps_the_parent_the_rival_and_the_expanded_rows() -> None:
    tables = expansion_tables()
    (study,) = expansion_studies(tables)
    assert study.label == "expand 4x1 -> 8x1 uniform" and study.missing == []
    assert set(study.tables["dense"]["n_expert"]) == {PARENT} and set(study.tables["scratch"]["n_expert"]) == {CHILD}
    assert len(study.tables["upcycled"]) == len(tables["expanded"])
    assert set(study.tables["upcycled"]["method"]) == {study.label}
    assert study.points == {"parent": len(study.tables["dense"]), "from scratch": len(study.tables["scratch"]),
                            "expanded": len(tables["expanded"])}
    assert study_label({"parent_experts": 8, "n_expert": 32, "topk": 2, "method": "expand-utility", "r": 0.5}) == \
        "expand 8x2 -> 32x2 utility r=0.5"


def test_no_expanded_rows_no_studies() -> None:
    assert expansion_studies({"scratch": expansion_tables()["scratch"]}) == []


def test_a_study_without_its_rival_arm_says_what_to_add() -> None:
    tables = expansion_tables()
    parents = tables["scratch"][tables["scratch"]["n_expert"] == PARENT]
    analysis = analyze({**EMPTY, "scratch": parents, "expanded": tables["expanded"]}, bootstrap=0, answers=False)
    (study,) = analysis.expansions
    assert study.analysis is None and study.dstar is None
    (missing,) = study.missing
    assert missing["arm"] == "from scratch" and "8x1" in missing["why"] and "from-scratch 8x1 runs" in missing["add"]
    assert any("not analysed" in line and "8x1" in line for line in summary_lines(analysis.to_json()))
    with pytest.raises(FitError, match="was not analysed"):
        study.decision(1e9, 1e9, 1e9)


def test_expanded_rows_without_a_parent_count_say_so() -> None:
    tables = expansion_tables()
    (study,) = expansion_studies({**tables, "expanded": tables["expanded"].assign(parent_experts=None)})
    assert [m["arm"] for m in study.missing] == ["parent"] and "parent_experts" in study.missing[0]["why"]


def test_expanded_rows_leave_the_upcycling_answer_as_it_was() -> None:
    """The dense->8x1 analysis of a sweep holding an expansion study is that of its own rows: neither the expanded
    rows nor the 4x1 parent's from-scratch runs (a configuration no upcycled row has) join its laws."""
    tables = with_upcycling()
    own = {"dense": tables["dense"], "upcycled": tables["upcycled"],
           "scratch": tables["scratch"][tables["scratch"]["n_expert"] == CHILD]}
    without = analyze(own, bootstrap=0, answers=False).to_json()
    both = analyze(tables, bootstrap=0, answers=False).to_json()
    assert len(both.pop("expansions")) == 1 and without.pop("expansions") == []
    assert both == without


@pytest.mark.slow
def test_dstar_expand_is_found_and_its_interval_covers_the_generating_one() -> None:
    analysis = analyze(with_upcycling(), bootstrap=20)
    (study,) = analysis.expansions
    assert study.analysis is not None and study.missing == []
    moe, up = truth()
    results = {r["n1"]: r for r in study.dstar["results"]}
    assert sorted(results) == list(SIZES)
    top = results[max(SIZES)]
    assert top["dstar_state"] == "crossing"
    for n1, r in results.items():
        true = dstar_at(moe, up, n1)["dstar"]
        if true is None:
            continue
        iv = r["intervals"]["80"]
        assert (iv["low_open"] or iv["low"] <= true) and (iv["high_open"] or true <= iv["high"]), (n1, true, iv)
    assert study.analysis.upcycled[0].answer is not None  # backtests, forms and the runs' bracket, as upcycling's
    assert study.decision(max(SIZES), 1e10, 1e10)["verdict"] in ("upcycle", "scratch", "undecided")
    lines = summary_lines(analysis.to_json())
    assert any(line.startswith("Expansion 4x1 -> 8x1 uniform") for line in lines)
    assert any("D*_expand at N1=" in line for line in lines)
    back = Analysis.from_json(json.loads(json.dumps(analysis.to_json())))
    assert back.to_json() == analysis.to_json() and back.expansions[0].label == study.label


def test_a_d_star_expand_above_the_range_says_expanding_wins_there() -> None:
    above = {"dstar": None, "dstar_state": "above", "search_range": [1e3, 4.9e7]}
    assert dstar(above, "expanding") == "> 4.9e+07 (expanding still wins there)"
    assert "upcycling still wins" in dstar(above)


def test_from_scratch_rows_predicted_from_a_parents_trunk_stay_out_of_the_upcycling_laws() -> None:
    """Decay ends predicted from trunk curves are filtered as the observed ones are: the 4x1 parent's predicted
    rows leave the dense->8x1 analysis's from-scratch table, the 8x1 ones stay; without expanded rows nothing is."""
    tables = with_upcycling()
    predicted = tables["scratch"].assign(source="predicted")
    kept = upcycling_scratch(predicted, tables)
    assert set(kept["n_expert"]) == {CHILD} and len(kept) == (predicted["n_expert"] == CHILD).sum()
    without = {k: v for k, v in tables.items() if k != "expanded"}
    assert len(upcycling_scratch(predicted, without)) == len(predicted)
    empty = predicted.iloc[0:0]  # no from-scratch run finished yet: the table keeps its columns
    assert list(upcycling_scratch(empty, tables).columns) == list(predicted.columns)
