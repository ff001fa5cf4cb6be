"""A real micro sweep with an expansion on embedded Ray with the real worker: a 2x1 MoE trained from scratch to D1
(the grid's own 2x1 scratch arm, cut at D1 as well), grown to 4 experts, trained D2 tokens; the 4x1 MoE from scratch
beside it. Every segment trains once and the expanded observation is recorded with its axes."""

from __future__ import annotations

from collections import Counter

import pytest

from upscale.control.analyses import sweep_tables
from upscale.control.curves import fitting_trunks, sweep_curves
from upscale.control.wiring import open_services
from upscale.orchestrator.observations import table
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.sweeps.planner import plan
from upscale.sweeps.spec import parse_spec

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.mark.slow  # 15 real segments: ~40 s on 2 cores
def test_a_sweep_with_an_expansion_records_expanded_observations(settings) -> None:
    spec = parse_spec({
        "name": "expanding", "model": {"sizes": ["nano"]}, "moe": {"experts": [2], "topk": [1]},
        "upcycling": {"methods": ["naive"]}, "expansion": {"parents": [{"n_expert": 2, "topk": 1}], "factors": [2]},
        "tokens": {"d1": [256], "d2": [256], "scratch": [512]}, "data": {"eval_tokens": 256},
        "train": {"context": 16, "batch_size": 4, "lr": {"dense": 3e-3, "moe": 2e-3}, "warmup_tokens": 64},
        "resources": {"cpus": 1}})
    orch = Orchestrator.open(settings)
    out = orch.run(spec, Scheduler(orch.store, orch.settings, poll_s=0.05))
    p = plan(spec)
    assert out.status == "done" and sorted(out.trained) == sorted(s.id for s in p.segments)
    assert p.by_kind()["expand"] == 1
    observations = orch.store.observations(out.sweep_id)
    assert Counter(o.kind for o in observations) == {"dense": 1, "upcycled": 1, "scratch": 3, "expanded": 1}
    (grown,) = [o for o in observations if o.kind == "expanded"]
    assert (grown.D1, grown.D2, grown.n_expert, grown.topk, grown.parent_experts, grown.method, grown.r) == \
        (256, 256, 4, 1, 2, "expand-uniform", None)
    parent = next(o for o in observations if o.kind == "scratch" and (o.n_expert, o.D) == (2, 256))
    assert grown.N1 == parent.N1
    # uniform copies at top-1 keep the parent's function: the expanded trunk starts at the parent's loss
    (trunk,) = [s for s in p.segments if s.spec.kind == "moe_trunk" and s.spec.model.n_expert == 4]
    start = orch.store.segment(trunk.id).result["metrics"]["val_loss_start"]
    assert start == pytest.approx(parent.loss, abs=1e-4)
    rows = table(observations, "expanded")
    assert list(rows["parent_experts"]) == [2] and table(observations, "upcycled")["parent_experts"].isna().all()
    # what the analysis reads: its tables and trunk curves hold no expanded row or trunk
    services = open_services(settings, auth=False)
    tables = sweep_tables(services, [out.sweep_id])
    assert [len(tables[k]) for k in ("dense", "upcycled", "scratch")] == [1, 1, 3]
    fitted = fitting_trunks(sweep_curves(services, [out.sweep_id]))
    assert fitted and trunk.id not in {t.trunk for t in fitted}
