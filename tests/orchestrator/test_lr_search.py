"""LR-search segments: an Optuna study in the state database picks the peak LR, pruning on intermediate validation
loss, and every trunk and branch below it trains at that LR.

Strategy: the counting segment function's loss has a known optimum at LR 10^-2.5 and falls with tokens, so trials
are comparable chunk by chunk; the study is read back from the same SQLite file with Optuna itself."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.orchestrator.conftest import TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan

pytestmark = pytest.mark.usefixtures("ray_session")

LR_SPEC = TINY_SPEC.replace("lr: {dense: 3.0e-3, moe: 2.0e-3}",
                            "lr_search: {trials: 6, low: 1.0e-4, high: 1.0e-1, tokens: 256}")


def test_lr_search_picks_the_lr_children_train_at(settings) -> None:
    orch = Orchestrator.open(settings)
    spec = load_spec(LR_SPEC)
    out = orch.run(spec, Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05))
    assert out.status == "done", [(s.kind, s.error) for s, _ in orch.store.members(out.sweep_id) if s.error]
    p = plan(spec)
    searches = [s for s in p.segments if s.spec.kind == "lr_search"]
    assert len(searches) == 2  # dense, and the 4x1 MoE (upcycled and from scratch share it)
    events = [json.loads(line) for line in (Path(settings.checkpoint_dir) / "events.jsonl").read_text().splitlines()]
    lr_of = {e["segment"]: e["lr"] for e in events if e["event"] == "start"}
    for search in searches:
        result = orch.store.segment(search.id).result
        study = optuna.load_study(study_name=f"upscale-lr-{search.id}", storage=settings.db_url)
        finished = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
        assert len(finished) == 6 and result["metrics"]["trials"] == 6
        assert result["metrics"]["pruned"] == sum(t.state == TrialState.PRUNED for t in finished) >= 1
        assert result["best_lr"] == study.best_params["lr"] and 1e-4 <= result["best_lr"] <= 1e-1
        complete = [t for t in finished if t.state == TrialState.COMPLETE]
        assert study.best_value == min(t.value for t in complete)
        # every segment planned below this search trained at its best LR (its stored spec says lr=None; the worker
        # saw the spec with the LR filled in), and its result is filed under its own key
        best = result["best_lr"]
        below = [s for s in p.segments if s.spec.optim and s.spec.optim.lr is None and s.spec.kind != "lr_search"
                 and _family(s.spec) == _family(search.spec)]
        resolved = [s.spec.model_copy(update={"optim": s.spec.optim.model_copy(update={"lr": best})}) for s in below]
        assert below and all(lr_of[r.id] == best for r in resolved)
        assert all(orch.store.segment(s.id).result["segment_id"] == s.id for s in below)


def _family(spec) -> tuple[int, int]:
    return spec.model.n_expert, spec.model.topk
