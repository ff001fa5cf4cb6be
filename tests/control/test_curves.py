"""Curves served per trunk (control/curves.py) from a real SQLite store: the tiny sweep planned by the real planner
(a validation every 2 steps), recorded, and driven to done by hand with the points a worker would report (one known
loss per token count), except one MoE decay (an interior point of its trunk) and the from-scratch trunk (no points:
not served). No Ray there; the slow test trains a nano sweep with the real worker and reads its curves back."""

from __future__ import annotations

import pytest

from tests.orchestrator.conftest import TINY_SPEC
from upscale.control.curves import fitting_trunks, sweep_curves
from upscale.control.services import Services
from upscale.control.wiring import open_services
from upscale.orchestrator.settings import Settings
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import DECAY_KINDS, SegmentResult

TPS = 64  # 4 sequences of 16 tokens
EVERY = 2 * TPS


def loss_at(tokens: int, below_trunk: bool = False) -> float:
    """The loss reported at ``tokens``: a decay's points past its start lie 0.5 below the trunk's line."""
    return 5.0 - tokens / 1000 - (0.5 if below_trunk else 0.0)


def points(kind: str, start: int, end: int) -> list[tuple[int, float]]:
    tokens = [start, *range(start + EVERY - start % EVERY, end, EVERY), end]
    return [(t, loss_at(t, kind in DECAY_KINDS and t > start)) for t in tokens]


@pytest.fixture
def done(tmp_path):
    return record(tmp_path)


def record(tmp_path, curves: bool = True):
    """The recorded sweep, every segment done but the left-out ones; (services, sweep id, plan, left out). Without
    ``curves``, results as segments reported them before they kept their curve: start and end losses only."""
    spec = load_spec(TINY_SPEC.replace("warmup_tokens: 64", f"warmup_tokens: 128, eval_every_tokens: {EVERY}"))
    planned = plan(spec)
    services = open_services(Settings(home=tmp_path), auth=False)
    sweep = services.store.create_sweep("tiny", spec.model_dump(mode="json"), {}, planned.segments)
    moe_decays = [s for s in planned.segments if s.spec.kind == "moe_decay"]
    left_out = {moe_decays[0].id} | {s.id for s in planned.segments if s.spec.kind.startswith("scratch")}
    for seg in planned.segments:
        if seg.id in left_out:
            continue
        trains = seg.spec.kind not in ("upcycle", "lr_search")
        curve = points(seg.spec.kind, seg.spec.start_tokens, seg.spec.end_tokens) if trains else []
        attempt = services.store.claim(seg.id, "test")
        services.store.complete(seg.id, attempt, SegmentResult(
            segment_id=seg.id, kind=seg.spec.kind, val_loss=curve[-1][1] if curve else None, tokens=seg.tokens,
            wall_s=1.0, tokens_per_s=1.0, checkpoint=f"/ck/{seg.id}", curve=curve if curves else [],
            metrics={"val_loss_start": curve[0][1]} if curve else {}))
    return services, sweep.id, planned, left_out


def test_every_trunk_is_one_curve_with_its_decays_schedules_and_interior_points(done) -> None:
    services, sweep_id, planned, left_out = done
    trunks = sweep_curves(services, [sweep_id])
    # the dense trunk and the 2 D1 x 2 methods upcycled trunks; the from-scratch one has no points
    assert [t.kind for t in trunks] == ["dense_trunk"] + ["moe_trunk"] * 4
    assert {t.trunk for t in trunks} == {s.trunk for s in planned.segments if s.spec.kind.endswith("_trunk")
                                         and s.id not in left_out}
    dense = trunks[0]
    # pieces [0, 7 steps) and [7, 14): their points on one axis, the join (448) once
    assert [t for t, _ in dense.curve] == [0, 128, 256, 384, 448, 512, 640, 768, 896]
    assert dense.curve == tuple((t, loss_at(t)) for t, _ in dense.curve)
    assert dense.tokens_per_step == TPS and dense.peak_lr == 3e-3 and dense.axes["size"] == "nano"
    assert dense.lr_multipliers == (0.5,) + (1.0,) * 13  # steps 1..14, warmup (2 steps) included
    # its two decays (D1 = 8 and 16 steps), each decaying over its last 10% from where it leaves the trunk
    assert [(d.branch_tokens, d.end_tokens) for d in dense.decays] == [(448, 512), (896, 1024)]
    short = dense.decays[0]
    assert short.lr_multipliers[:7] == dense.lr_multipliers[:7] and short.lr_multipliers[-1] == pytest.approx(0.1)
    assert short.curve == ((448, loss_at(448)), (512, loss_at(512, True)))
    assert short.loss == loss_at(512, True)
    assert short.observation | {"segment_key": None} == {
        "kind": "dense", "N1": planned.segments[0].axes["N1"], "D1": 512, "D2": None, "D": 512, "N2": None,
        "N_total": None, "n_expert": None, "topk": None, "parent_experts": None, "method": None, "r": None,
        "loss": short.loss, "segment_key": None}
    assert dense.interior == ()
    # the MoE trunk whose first decay was left out: it is an interior point (branching inside the trained part)
    (holder,) = [t for t in trunks if any(d.segment_key in left_out for d in t.interior)]
    (inner,) = holder.interior
    assert inner.loss is None and inner.curve == () and inner.branch_tokens <= holder.curve[-1][0]
    assert inner.observation["kind"] == "upcycled" and "loss" not in inner.observation
    assert all(d.segment_key not in left_out for t in trunks for d in t.decays)
    assert holder.axes["method"] in ("naive", "drop") and holder.axes["D1"] in (512, 1024)


def test_decays_between_a_trunks_budgets_are_offered_where_it_is_trained(done) -> None:
    """Between the dense budgets of 8 and 16 steps: one at round(sqrt(8 x 16)) = 11 steps, decaying over its last
    step as the 8-step one does (1 of 8), branching at step 10, on the trained part; its row sets D and D1."""
    services, sweep_id, _, _ = done
    dense = sweep_curves(services, [sweep_id])[0]
    (middle,) = dense.between
    assert (middle.branch_tokens, middle.end_tokens, middle.segment_key, middle.loss) == (640, 704, "", None)
    assert middle.lr_multipliers[:10] == dense.lr_multipliers[:10] and len(middle.lr_multipliers) == 11
    assert middle.lr_multipliers[-1] == pytest.approx(0.1)
    assert middle.observation["D"] == middle.observation["D1"] == 704 and middle.observation["N1"] == \
        dense.decays[0].observation["N1"]
    (row,) = [i.row for i in fitting_trunks([dense])[0].interior]
    assert (row["D"], row["segment"], row["loss"]) == (704, None, None)


def test_trunks_convert_to_the_curve_laws_trunks(done) -> None:
    """LRs as multipliers of the trunk's own peak, the step-0 point dropped, each trunk's table and family, and its
    interior decays as rows of its table (no loss: to be predicted)."""
    services, sweep_id, _, _ = done
    served = sweep_curves(services, [sweep_id])
    trunks = {t.trunk: t for t in fitting_trunks(served)}
    dense = served[0]
    trunk = trunks[dense.trunk]
    assert trunk.curve.steps.tolist() == [2, 4, 6, 7, 8, 10, 12, 14]  # the step-0 point has no place in the law
    assert trunk.curve.lr.tolist() == list(dense.lr_multipliers) and trunk.curve.lr.max() == 1.0
    assert trunk.curve.loss.tolist() == [v for t, v in dense.curve if t > 0]
    decay = trunk.decays[1]
    assert decay.lr.size == 16 and decay.steps.tolist() == [14, 16] and decay.loss[-1] == dense.decays[1].loss
    assert (trunk.table, trunk.family) == ("dense", "dense")
    moe = next(t for t in served if t.interior)
    converted = trunks[moe.trunk]
    assert converted.table == "upcycled" and converted.family.startswith(f"upcycled {moe.axes['method']}")
    row = converted.interior[0].row  # the planned one; those between its budgets follow
    planned = moe.interior[0].observation
    assert row["loss"] is None and row["trunk"] == moe.trunk and row["segment"] == moe.interior[0].segment_key
    assert (row["D1"], row["D2"], row["N1"]) == (planned["D1"], planned["D2"], planned["N1"])
    assert converted.interior[0].lr.size == moe.interior[0].end_tokens // TPS


def test_results_recorded_before_segments_kept_their_curve_give_their_start_and_end(tmp_path) -> None:
    services, sweep_id, _, _ = record(tmp_path, curves=False)
    dense = sweep_curves(services, [sweep_id])[0]
    assert dense.curve == ((0, loss_at(0)), (448, loss_at(448)), (896, loss_at(896)))
    assert [d.curve for d in dense.decays] == [((448, loss_at(448)), (512, loss_at(512, True))),
                                               ((896, loss_at(896)), (1024, loss_at(1024, True)))]


@pytest.mark.slow  # a real nano sweep trained on embedded Ray with the real worker: ~80 s on 2 cores
def test_a_trained_sweeps_trunks_carry_the_workers_curves(ray_session, settings) -> None:
    from upscale.orchestrator.scheduler import Scheduler

    spec = load_spec(TINY_SPEC.replace("warmup_tokens: 64", f"warmup_tokens: 64, eval_every_tokens: {EVERY}")
                     .replace("methods: [naive, drop]", "methods: [naive]").replace(", scratch: [512]", ""))
    services = open_services(settings, auth=False)
    out = services.orch.run(spec, Scheduler(services.store, settings, poll_s=0.05))
    assert out.status == "done"
    trunks = sweep_curves(services, [out.sweep_id])
    assert [t.kind for t in trunks] == ["dense_trunk", "moe_trunk", "moe_trunk"]  # one upcycled trunk per D1
    for trunk in trunks:
        tokens = [t for t, _ in trunk.curve]
        assert tokens == sorted(set(tokens)) and tokens[0] == 0 and tokens[-1] == len(trunk.lr_multipliers) * TPS
        assert set(range(0, tokens[-1] + 1, EVERY)) <= set(tokens)  # the cadence, on the sweep's token axis
        assert len(trunk.decays) == 2 and trunk.interior == ()
        for decay in trunk.decays:  # a branch starts from the trunk's weights at its branch point: the same loss
            assert decay.curve[0] == (decay.branch_tokens, dict(trunk.curve)[decay.branch_tokens])
            assert decay.curve[-1][1] == decay.loss == decay.observation["loss"]
    dense = trunks[0]
    assert dense.curve[-1][1] < dense.curve[0][1] - 0.5  # it trained


def test_an_analysis_hashes_the_curves_it_will_predict_from_without_predicting(done) -> None:
    """Reading the curves for an analysis's inputs hash is a store read: the predictions are the analysis's work."""
    from upscale.control.analyses import analysis_params, curve_trunks
    from upscale.fitting.curve_observations import trunks_hash

    services, sweep_id, _, _ = done
    assert curve_trunks(services, [sweep_id], curves=False) is None
    trunks = curve_trunks(services, [sweep_id], curves=True)
    assert trunks and any(t.interior for t in trunks)
    params = analysis_params(None, 0, 0, trunks=trunks)
    assert params["curves"] == trunks_hash(fitting_trunks(sweep_curves(services, [sweep_id])))
    assert "curves" not in analysis_params(None, 0, 0)  # without curves: the parameters an analysis always had


def _move_a_trunk_curve(services: Services, planned) -> None:
    """As a trunk piece finishing does: a curve changes and no observation does."""
    from upscale.orchestrator.records import SegmentRecord

    piece = next(s for s in planned.segments if s.spec.kind == "moe_trunk")
    with services.store.transaction() as s:
        row = s.get(SegmentRecord, piece.id)
        curve = [[t, loss + 0.01] for t, loss in row.result["curve"]]
        row.result = {**row.result, "curve": curve}


@pytest.mark.slow  # ~9 s on 2 busy cores (make test stays under 10 minutes)
def test_refits_and_new_analyses_follow_the_curves_not_only_the_observations(done) -> None:
    from upscale.control.analyses import analyse_if_new, run_analysis
    from upscale.control.records import AnalysisRecord
    from upscale.control.refits import RefitLoop, create_schedule, refits
    from upscale.control.schemas import RefitRequest, RefitScheduleCreate

    services, sweep_id, planned, _ = done
    first = analyse_if_new(services, sweep_id, bootstrap=0)
    assert first is not None and first.params["curves"] and analyse_if_new(services, sweep_id, bootstrap=0) is None
    schedule = create_schedule(services, RefitScheduleCreate(name="on data", trigger="on_new_observations",
                                                             request=RefitRequest(sweep_ids=[sweep_id], bootstrap=0)),
                               "alice")
    loop = RefitLoop(services)
    loop.tick()
    (v1,) = refits(services, schedule.id)
    with services.store.transaction() as s:
        assert s.get(AnalysisRecord, v1.analysis_id).inputs_hash == v1.inputs_hash  # the curves hashed, as analysed
    loop.tick()
    assert len(refits(services, schedule.id)) == 1  # nothing moved

    _move_a_trunk_curve(services, planned)
    loop.tick()
    assert [r.version for r in refits(services, schedule.id)] == [1, 2]
    again = analyse_if_new(services, sweep_id, bootstrap=0)
    assert again is not None and again.params["curves"] != first.params["curves"]
    assert again.observations_hash == first.observations_hash
    _move_a_trunk_curve(services, planned)  # an analysis asked for without curves is not replaced by the loop's
    run_analysis(services, [sweep_id], bootstrap=0, owner="upscale", trigger="request", curves=False)
    assert analyse_if_new(services, sweep_id, bootstrap=0) is None
