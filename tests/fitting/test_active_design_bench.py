"""bench/active_design.py --quick: the JSON the issue specifies, with figures a broken criterion or cost model would
get wrong (the c-optimal design needs less of the full grid's FLOPs than picking points at random), and the
curve-aware method's parts: its curves end where the truth's decays end, its off-grid predicted decays lie on bought
trunk parts and never join the pool, one bought (upscale_curves_any_branch) costs its trunk only up to its branch and
reveals no curve beyond it, it never buys a stopped trunk; bench/demo_replay.py charges the planner's FLOPs
and grid_stop never spends more than the full grid."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import active_design as bench  # noqa: E402  (bench/ is scripts, not a package)
import demo_replay  # noqa: E402


@pytest.fixture(scope="module")
def sim() -> bench.Sim:
    p = bench.grid_plan()
    target = float(max(s.observation.N1 for s in p.observations()))
    truth = bench.draw_truths(1, target, np.random.default_rng(0))[0]
    return bench.Sim(p, truth, target, seed=0)


def test_simulated_curves_end_on_the_observed_decays_and_sit_above_them_at_constant_lr(sim: bench.Sim) -> None:
    curves = sim.curves
    for lay in list(curves.layout.values())[:3]:
        for d, (branch, _) in lay.decays.items():
            decay = curves.decay_curves[d]
            assert decay.loss[-1] == sim.y[d] and decay.steps[-1] == decay.lr.size
            assert decay.lr[-1] == pytest.approx(0.1) and decay.lr[decay.steps[0] - 2] == 1.0
            piece = next(sid for sid, _, end in lay.pieces if end == branch)
            assert curves.piece_curves[piece][1][-1] > decay.loss[-1]  # the decay gains, beyond the noise


@pytest.fixture(scope="module")
def curved(sim: bench.Sim) -> bench.State:
    """The pilot with its curves' predictions, off-grid decays included."""
    state = bench.State(list(sim.pilot), sim.fitter(), curves=True, offgrid=True)
    sim.refit(state, set(bench.LAW))
    return state


def test_offgrid_predicted_decays_lie_on_bought_trunk_parts_and_never_join_the_pool(sim: bench.Sim,
                                                                                   curved: bench.State) -> None:
    pool = {q.segment for q in sim.pool}
    assert not pool & set(sim.virtual)
    offgrid = [k for k in curved.predicted if k not in pool]
    assert offgrid and all(k in sim.virtual for k in offgrid)
    have = curved.have()
    for k in offgrid:
        t = sim.virtual[k].trunk
        n = sim.curves.trained(t, have)
        branch = next(b for key, b, _ in sim.curves.offgrid[t] if key == k)
        assert n and branch * sim.curves.unit <= sim.curves.layout[t].pieces[n - 1][2]
        assert sim.virtual[k].coords != next(q for q in sim.pool if q.trunk == t).coords
    grid_only = bench.State(list(sim.pilot), sim.fitter(), curves=True)
    sim.refit(grid_only, set(bench.LAW))
    assert set(grid_only.predicted) == set(curved.predicted) & pool  # the same fits, less the off-grid rows
    picked = bench.choose_upscale_curves(sim, curved, [q for q in sim.pool if q not in set(curved.bought)],
                                         np.random.default_rng(0))
    assert isinstance(picked, bench.Extension) or {q.segment for q in picked} <= pool


def test_an_offgrid_decay_bought_costs_its_decay_and_its_trunk_to_its_branch_and_reveals_the_curve_to_there(
        sim: bench.Sim) -> None:
    curves, unit = sim.curves, sim.curves.unit
    t, lay = next((t, lay) for t, lay in curves.layout.items() if lay.family == "up")
    key, branch, _ = curves.offgrid[t][2]  # between the grid's second and third budgets
    piece, start, end = next(p for p in lay.pieces if p[1] < branch * unit <= p[2])
    assert start < branch * unit < end  # it branches inside a trunk piece
    before = {sid for sid, _, e in lay.pieces if e <= start}
    seg, decay, grid = sim.dag.segments[piece], sim.dag.segments[key], sim.dag.segments[next(iter(lay.decays))]
    assert decay.flops / decay.tokens == pytest.approx(grid.flops / grid.tokens)
    partial = seg.flops * (branch * unit - start) / seg.tokens
    assert sim.cost_segments(before, {key}) == pytest.approx(partial + decay.flops)
    trained_past = before | {piece}  # no checkpoint at its branch point: the span from the piece's start is retrained
    assert sim.cost_segments(trained_past, {key}) == pytest.approx(partial + decay.flops)
    lower, low_branch, _ = curves.offgrid[t][1]  # on the piece before: trained past too, retrained from its start
    start_before = next(p[1] for p in lay.pieces if p[1] < low_branch * unit <= p[2])
    low = sim.dag.segments[lower]
    assert sim.cost_segments(trained_past, {key, lower}) == pytest.approx(
        partial + decay.flops + low.flops + sim.dag.segments[low.parents[0]].flops * (low_branch * unit - start_before)
        / sim.dag.segments[low.parents[0]].tokens)
    assert sim.cost_segments(before | {key}, {piece}) == pytest.approx(seg.flops - partial)  # on from its branch
    have = before | {key}
    assert curves.reach(t, have) == branch * unit and curves.trained(t, have) == len(before)
    _, trunks, _, ids = curves.family_trunks("up", have)
    mine = next(tc for tc in trunks if tc.trunk == t)
    assert start / unit < mine.curve.steps[-1] <= branch  # no curve beyond what was paid for
    assert curves.decay_curves[key] in mine.decays and key not in ids  # observed, not predicted
    assert curves.decay_curves[key].loss[-1] == sim.y[key] and key in {q.segment for q in sim.offgrid_pool}
    assert not {q.segment for q in sim.offgrid_pool} & {q.segment for q in sim.pool}


def test_a_stopped_trunk_is_never_bought(sim: bench.Sim, curved: bench.State) -> None:
    state = bench.State(list(curved.bought), curved.fitter, curves=True, offgrid=True, predicted=curved.predicted,
                        sd_pred=curved.sd_pred, criterion=curved.criterion, noise=curved.noise)
    left = [q for q in sim.pool if q not in set(state.bought)]
    rng = np.random.default_rng(0)

    def trunk_of(pick) -> str:
        return pick.trunk if isinstance(pick, bench.Extension) else pick[0].trunk

    first = bench.choose_upscale_curves(sim, state, left, rng)
    state.stopped.add(trunk_of(first))
    live = [q for q in left if q.trunk not in state.stopped]
    again = bench.choose_upscale_curves(sim, state, live, rng)
    assert trunk_of(again) not in state.stopped
    assert not isinstance(again, bench.Extension) or again.piece not in {
        p for t in state.stopped for p, _, _ in sim.curves.layout[t].pieces}


def test_the_grid_budgets_and_the_truths_around_them_follow_budgets() -> None:
    """``--budgets``: the planned grid decays at the budgets given (to whole steps), and the truths' D* are placed
    inside, at the edge of and outside those budgets, not the default ones."""
    budgets = (4e9, 8e9, 1.6e10, 3.2e10)
    p = bench.grid_plan(budgets)
    pool = bench.pool_of(p)
    assert len(pool) == 4 * 4 * 4 + 4 * 4
    assert sorted({q.coords["D"] for q in pool if q.law == "moe"}) == pytest.approx(budgets, rel=1e-3)
    assert sorted({q.coords["D1"] for q in pool if q.law == "up"}) == pytest.approx(budgets, rel=1e-3)
    target = float(max(s.observation.N1 for s in p.observations()))
    truths = bench.draw_truths(6, target, np.random.default_rng(0), budgets)
    for _, _, dstar, where in truths:
        inside = budgets[0] <= dstar <= budgets[-1]
        assert inside == (where == "inside") and (where != "edge" or budgets[0] / 2 <= dstar <= budgets[-1] * 2)
    assert {w for *_, w in truths} == {"inside", "edge", "outside"}


@pytest.mark.slow  # starts bench/active_design.py as a subprocess: about a minute on a 2-core machine
def test_quick_bench_writes_the_figures(tmp_path) -> None:
    out = tmp_path / "figures.json"
    methods = "upscale,upscale_curves,anchor,random,cheapest"  # grid_stop has its own test; the rest cost time
    run = subprocess.run([sys.executable, "-W", "ignore", str(ROOT / "bench" / "active_design.py"), "--quick",
                          "--draws", "2", "--workers", "2", "--methods", methods, "--json", str(out)],
                         capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    figures = json.loads(out.read_text())
    assert figures == json.loads(run.stdout)
    methods = {"upscale", "upscale_curves", "anchor", "random", "cheapest"}
    assert methods <= set(figures["fraction_of_full_flops"]) and methods <= set(figures["coverage_80"])
    assert set(figures["log10_dstar_error_at"]) == {"0.1", "0.2"}
    assert methods <= set(figures["log10_dstar_error_at"]["0.1"]) and figures["truths"] == 3
    assert figures["draws"] == 2 and all(len(v) == 2 for v in figures["coverage_80_by_draw"].values())
    for m, v in figures["coverage_80"].items():  # the pooled share is the mean of the draws' shares
        assert abs(v - sum(figures["coverage_80_by_draw"][m]) / 2) < 1e-12
        assert figures["coverage_80_se"][m] >= 0
    assert all(0 < v <= 1 for v in figures["fraction_of_full_flops"].values())
    assert all(0 <= v <= 1 for v in figures["coverage_80"].values())
    assert set(figures["coverage_80_delta"]) == set(figures["coverage_80"])  # the delta method's, for comparison
    assert figures["fraction_of_full_flops"]["upscale"] < figures["fraction_of_full_flops"]["random"]
    assert set(figures["goals"]) == {"upscale_le_0.30", "upscale_le_0.6x_anchor", "coverage_ge_0.75",
                                     "upscale_curves_le_0.08", "upscale_curves_coverage_ge_0.75"}
    assert set(figures["predicted_share"]) == {"upscale_curves"}
    assert 0 <= figures["predicted_share"]["upscale_curves"] <= 1
    assert 0 <= figures["stopped_flops"]["upscale_curves"] <= 1 and figures["grid_stop_spent"] is None


def bench_data(name: str) -> dict:
    """A dataset of bench/data as bench/export_curves.py wrote it."""
    return json.loads((ROOT / "bench" / "data" / name).read_text())


def losses_at_equal_budgets(raw: dict, tokens: float) -> tuple[dict, dict]:
    """A dataset's upcycled losses at D1 = D2 = ``tokens`` and from-scratch losses at D = ``tokens``, by N1."""
    up = {o["N1"]: o["loss"] for o in raw["observations"]
          if o["kind"] == "upcycled" and o["D1"] == o["D2"] == tokens}
    scratch = {o["N1"]: o["loss"] for o in raw["observations"] if o["kind"] == "scratch" and o["D"] == tokens}
    return up, scratch


@pytest.fixture(scope="module")
def replay() -> demo_replay.Replay:
    return demo_replay.Replay(json.loads(demo_replay.DATA.read_text()), "naive")


@pytest.fixture(scope="module")
def any_branch() -> demo_replay.Replay:
    """The demo replayed with its off-grid decays buyable, as a real run trained them."""
    return demo_replay.Replay(json.loads(demo_replay.DATA.read_text()), "naive", bench_data("demo_any_branch.json"))


def test_the_replay_charges_the_planners_flops_for_what_it_buys(replay: demo_replay.Replay) -> None:
    data = json.loads(demo_replay.DATA.read_text())
    segments = {s["key"]: s for s in data["segments"]}
    n1 = min(q.coords["N1"] for q in replay.pool if q.law == "up")
    first, second = (next(q for q in replay.pool if q.law == "up" and q.coords == {"D1": 245760.0, "D2": d2,
                                                                                   "N1": n1})
                     for d2 in (122880.0, 245760.0))
    moe_trunk = [s for s in segments.values() if s["trunk"] == first.trunk and s["kind"] == "moe_trunk"]
    upcycle = segments[next(s for s in moe_trunk if s["start_tokens"] == 0)["parents"][0]]
    dense_decay = segments[upcycle["parents"][0]]
    assert (upcycle["kind"], dense_decay["kind"], dense_decay["end_tokens"]) == ("upcycle", "dense_decay", 245760)
    dense_pieces = [s for s in segments.values() if s["trunk"] == dense_decay["trunk"] and s["kind"] == "dense_trunk"
                    and s["end_tokens"] <= dense_decay["start_tokens"]]
    by_hand = sum(s["flops"] for s in [*dense_pieces, dense_decay, upcycle, segments[first.segment]]
                  + [s for s in moe_trunk if s["end_tokens"] <= segments[first.segment]["start_tokens"]])
    assert len(dense_pieces) == 2 and replay.cost([], [first]) == pytest.approx(by_hand, rel=1e-12)
    piece = next(s for s in moe_trunk if s["end_tokens"] == segments[second.segment]["start_tokens"])
    assert replay.cost([first], [second]) == pytest.approx(piece["flops"] + segments[second.segment]["flops"],
                                                           rel=1e-12)  # the trunk and dense parts are bought
    assert len(replay.pool) == 36 and not {q.segment for q in replay.pool} & set(replay.virtual)
    assert replay.dag.full == pytest.approx(replay.dag.cost({q.segment for q in replay.pool}))
    assert not replay.offgrid_pool  # the demo grid trained no off-grid decay: they are only predicted


def test_the_any_branch_replay_buys_the_off_grid_decays_a_real_run_trained(replay: demo_replay.Replay,
                                                                           any_branch: demo_replay.Replay) -> None:
    data, extended, sim = json.loads(demo_replay.DATA.read_text()), bench_data("demo_any_branch.json"), any_branch
    assert [q.segment for q in sim.pool] == [q.segment for q in replay.pool] and sim.dag.full == replay.dag.full
    assert {q.segment for q in sim.offgrid_pool} == set(sim.virtual) and len(sim.offgrid_pool) == 3 * 12
    q = next(q for q in sim.offgrid_pool if q.law == "up" and q.coords["D2"] == 174080.0)
    ours = next(t for t in data["trunks"] if t["trunk"] == q.trunk)["axes"]
    theirs = next(t for t in extended["trunks"] if {**t["axes"], "sweep": "demo"} == ours)
    decay = next(d for d in theirs["decays"] if d["end_tokens"] == 174080)
    flops = next(s["flops"] for s in extended["segments"] if s["key"] == decay["segment_key"])
    assert sim.y[q.segment] == decay["loss"] and sim.dag.segments[q.segment].flops == flops
    assert sim.curves.decay_curves[q.segment].loss[-1] == decay["loss"]
    lay = sim.curves.layout[q.trunk]
    before = {sid for sid, _, end in lay.pieces if end <= decay["branch_tokens"]}
    piece = next(sid for sid, a, b in lay.pieces if a < decay["branch_tokens"] < b)
    partial = (sim.dag.segments[piece].flops * (decay["branch_tokens"] - sim.dag.segments[piece].start)
               / sim.dag.segments[piece].tokens)
    assert sim.cost_segments(before, {q.segment}) == pytest.approx(partial + flops)


def test_the_oracle_design_chooses_at_the_truth_and_may_branch_anywhere(any_branch: demo_replay.Replay) -> None:
    """oracle_any_branch reads today's criterion at the replay's truth (the full grid's fit) and may buy the real
    off-grid decays; it reaches the full grid's width, and its first purchases are off-grid decays."""
    sim = any_branch
    bought: list = []
    choose = bench.CHOOSERS[bench.ORACLE]

    def recording(*args):
        picked = choose(*args)
        bought.append(picked)
        return picked

    bench.CHOOSERS[bench.ORACLE] = recording
    try:
        outcome = bench.run_method(sim, bench.ORACLE, sim.width(sim.pool), seed=0, until_width=True)
    finally:
        bench.CHOOSERS[bench.ORACLE] = choose
    assert 0 < outcome.fraction < 1 and bought
    assert all(q.segment in sim.virtual for q in bought[0])
    assert sim.width([*sim.pilot, *(q for a in bought for q in a)]) <= sim.width(sim.pool) * bench.SLACK


def test_the_grid_view_of_a_run_with_off_grid_decays_is_the_grid_trained_alone() -> None:
    """`grid_view` of the demo trained with its off-grid decays gives back the demo grid's plan, FLOPs and losses,
    which is what lets the wide grid (bench/data/wide_any_branch.json) be replayed from one training run."""
    demo = json.loads(demo_replay.DATA.read_text())
    view = demo_replay.grid_view(bench_data("demo_any_branch.json"))

    def shape(data: dict) -> list:
        return sorted((s["kind"], s["start_tokens"], s["end_tokens"], s["flops"]) for s in data["segments"])

    def losses(data: dict) -> dict:
        return {(o["kind"], o["N1"], o["D1"], o["D2"], o["D"], o["method"]): o["loss"] for o in data["observations"]}

    assert shape(view) == shape(demo) and view["total_flops"] == demo["total_flops"]
    assert losses(view) == losses(demo)  # training is deterministic: cutting a trunk elsewhere changes no loss
    keys = {s["key"] for s in view["segments"]}
    assert all(p in keys for s in view["segments"] for p in s["parents"])  # every branch finds its merged parent
    assert {d["segment_key"] for t in view["trunks"] for d in t["decays"]} <= keys


def test_the_wide_replay_holds_its_grid_and_refuses_a_size_without_a_dstar(capsys) -> None:
    """The wide grid (4 sizes x 4 budgets at the demo's scale) is replayed from its one run; at its largest size the
    full fit's laws do not cross, so there is nothing to pin down: the replay says so and names the sizes that have
    a D*, as it does for a size the grid lacks."""
    raw = bench_data("wide_any_branch.json")
    view = demo_replay.grid_view(raw)
    with pytest.raises(SystemExit, match=r"do not cross at N1 = 295392 .*cross at N1 = 32928, 73968, 131392"):
        demo_replay.Replay(view, "naive", raw)
    with pytest.raises(SystemExit, match="--n1 5 is not a size of the grid: choose one of 32928"):
        demo_replay.Replay(view, "naive", raw, 5.0)
    with pytest.raises(SystemExit):  # --grid-of replaces the demo's files: both at once is a mistake, said so
        demo_replay.main(["--grid-of", str(demo_replay.DATA.parent / "wide_any_branch.json"),
                          "--data", str(demo_replay.DATA)])
    assert "--grid-of replaces --data" in capsys.readouterr().err
    sim = demo_replay.Replay(view, "naive", raw, 131392.0)
    assert len(sim.pool) == 4 * 4 * 4 + 4 * 4 and len(sim.offgrid_pool) == (4 * 4 + 4) * 4  # 4 off-grid ends a trunk
    assert sim.dag.cost({q.segment for q in sim.pilot}) < 0.05 * sim.dag.full  # the demo's pilot costs 0.23 of it
    assert 0 < sim.true_dstar < math.inf


def test_the_wide64_replay_spans_the_simulated_grids_budgets() -> None:
    """bench/data/wide64_any_branch.json: the demo's three sizes with budgets 4x apart over 64x, as the simulated grid's
    are, and three off-grid decays a trunk (their midpoints); the replay's default size has a D*."""
    raw = bench_data("wide64_any_branch.json")
    sim = demo_replay.Replay(demo_replay.grid_view(raw), "naive", raw)
    budgets = sorted({q.coords["D"] for q in sim.pool if q.law == "moe"})
    assert budgets == [32768.0, 131072.0, 524288.0, 2097152.0]
    assert len(sim.pool) == 3 * 4 * 4 + 3 * 4 and len(sim.offgrid_pool) == (3 * 4 + 3) * 3
    assert 0 < sim.true_dstar < math.inf


def test_the_inside_grid_moves_up_and_its_dstar_moves_with_it() -> None:
    """bench/data/inside_any_branch.json is the wide64 grid moved up 2x, so that wide64's D* (1.05-1.7x its largest
    budget) would lie inside it. It does not stay there: upcycling still wins at every size at the new largest
    budget, by 0.05 in loss, and the full fit's D* moves up with the grid, to 0.9-1.2x its largest budget again."""
    raw = bench_data("inside_any_branch.json")
    view = demo_replay.grid_view(raw)
    top = 2048 * 2048.0
    sizes = (32928.0, 73968.0, 131392.0)
    up, scratch = losses_at_equal_budgets(raw, top)
    assert all(0.04 < scratch[n] - up[n] < 0.07 for n in sizes), (up, scratch)
    wide64 = bench_data("wide64_any_branch.json")
    wide64_view = demo_replay.grid_view(wide64)
    for n1 in sizes:
        before = demo_replay.Replay(wide64_view, "naive", wide64, n1).true_dstar
        now = demo_replay.Replay(view, "naive", raw, n1).true_dstar
        assert before < top and 0.85 * top < now < 1.25 * top, (n1, before, now)  # inside the new grid, then not


def test_upcycling_ties_from_scratch_four_times_past_the_inside_grid_where_its_full_fit_is_far_off() -> None:
    """bench/data/beyond_probe.json trains D1 = D2 = D = 8192 steps, 4x the inside grid's largest budget, at the
    smallest and largest demo sizes: upcycled and from scratch tie there (upcycling was ahead by 0.05 at the inside
    grid's top), so the lead ends between 2048 and 8192 steps. The inside grid's full fit, which the replay scores
    designs against, put scratch ahead there by more than 0.2 and its D* below a third of that budget."""
    top = 8192 * 2048.0
    up, scratch = losses_at_equal_budgets(bench_data("beyond_probe.json"), top)
    raw = bench_data("inside_any_branch.json")
    view = demo_replay.grid_view(raw)
    for n1 in (32928, 131392):
        assert abs(scratch[n1] - up[n1]) < 0.01, (n1, up, scratch)
        fit = demo_replay.Replay(view, "naive", raw, float(n1))
        at = {"N": np.array([n1]), "N1": np.array([n1]), "D": np.array([top]), "D1": np.array([top]),
              "D2": np.array([top])}
        predicted = {k: float(law.predict(fit.oracle.params[k], at)[0]) for k, law in bench.LAW.items()}
        assert predicted["up"] - predicted["moe"] > 0.2, predicted
        assert fit.true_dstar < top / 3


@pytest.mark.slow  # ~20 s: grid_stop refits the replay's curves after every wave
def test_grid_stop_never_buys_a_stopped_trunk_nor_more_than_the_full_grid(replay: demo_replay.Replay) -> None:
    width = replay.width(replay.pool)
    eager = bench.StopRule(after_sd=math.inf, gain=0.2, draws=1)  # stops early and often on the demo
    state_log: list = []
    outcome = bench.run_grid_stop(replay, width, seed=0, rule=eager, log=state_log)
    assert 0 < outcome.spent_total <= 1 and outcome.stopped_flops == pytest.approx(1 - outcome.spent_total)
    assert any(stopped for _, stopped in state_log), "the eager rule should stop some trunk on the demo"
    for segments, stopped in state_log:
        assert not {replay.point(s).trunk for s in segments} & stopped
