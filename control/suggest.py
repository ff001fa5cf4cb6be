"""Which grid extensions to add to a sweep next: `upscale suggest` and POST /sweeps/{id}/suggest.

Candidates are extensions of the sweep's spec, each the `additions` that POST /sweeps/{id}/extend merges: a larger or
smaller D2, D1 or from-scratch budget (every trunk gets the new branch, a trunk extension where it is larger), a budget
between two of the grid's (an interior branch point: every trunk branches from its trained part, retraining only
the span from the cut before it, as sweeps/reuse.py takes the rest over) and the next larger dense size. What an
action adds is read from the planner (the merged spec's new observation segments, with the trunk each hangs from);
what it costs is `compare(store, plan(merged)).figures()["new_flops"]`, so what the store holds is free and an
action's FLOPs are marginal to the actions ranked before it. fitting/design.py weighs them against the newest
analysis's fits: shrinkage of the D* interval at N1 per FLOP, greedily under the budget, until the tolerance. The
analysis's decay ends predicted from trunk curves (docs/laws.md, "Curves as observations") are rows of the criterion
with their held-out error: observing such a point replaces its prediction, so an action is credited only with what
the curves did not already tell.

With ``study`` (an expansion study's label) the target is its D*_expand instead: the study's own analysis and its
three tables (fitting/expansion.py), whose rows are the m·E-expert MoE's from-scratch decays and the study's expanded
decays.

The other way to spend less is to stop: a from-scratch or MoE trunk of the sweep still training whose planned decays
would shrink D*'s sd by less than ``STOP_GAIN`` is listed with the FLOPs its unfinished segments would still cost.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from upscale.control.analyses import NotReady, latest_analysis, sweep_tables, why_no_analysis
from upscale.control.schemas import StopAdvice, SuggestedAction, Suggestion, SuggestRequest
from upscale.control.services import Services
from upscale.control.sweeps import extend, merge
from upscale.fitting.analysis import Analysis
from upscale.fitting.answer import GroupAnswer
from upscale.fitting.bootstrap import percentile_interval
from upscale.fitting.design import (
    STOP_GAIN,
    DstarCriterion,
    Rows,
    delta_interval,
    dstar_gradient,
    free_params,
    greedy,
    log_loss_jacobian,
    noise_from_fits,
    sd_shrink,
)
from upscale.fitting.dstar import crossings_and_samples, upcycled_loss
from upscale.fitting.errors import FitError
from upscale.fitting.expansion import EXPANDED, STUDY_COLUMNS, expansion_studies, upcycling_configs, upcycling_tables
from upscale.fitting.groups import GROUP_COLUMNS, upcycled_groups
from upscale.fitting.profile import Observed, ProfileInterval, profile_interval
from upscale.fitting.summary import finite_or_none
from upscale.orchestrator.plan_in_store import compare
from upscale.sweeps.planner import PlannedSegment, plan
from upscale.sweeps.segments import BUILD_KINDS, MAX_TOKENS
from upscale.sweeps.sizes import NAMED_SIZES, dense_params
from upscale.sweeps.spec import SpecError, SweepSpec, parse_spec

NEW_SIZES = 1  # larger named sizes offered as candidates
# trunks nothing else grows from, but an expansion's parent (a scratch trunk an expand branches off): stopping one
# stops only itself
LEAF_TRUNKS = ("moe_trunk", "scratch_trunk")
# Actions one call chooses: each costs a plan of the extended grid per candidate, so a call plans at most
# (MAX_ACTIONS + 1) x its ~10 candidates; `stopped: "limit"` says to apply them and ask again for more.
MAX_ACTIONS = 4


class SuggestError(ValueError):
    """A request the criterion cannot answer as asked (a budget too small): 422 at ``field``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Candidate:
    kind: str
    description: str
    additions: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.description}"


def candidates(spec: SweepSpec) -> list[Candidate]:
    """The extensions weighed: each budget list's max x2, x4, min / 2 and the geometric middle of each two neighbours,
    and the next larger named size."""
    out = []
    for kind, values in (("d2", spec.tokens.d2), ("d1", spec.tokens.d1), ("scratch", spec.tokens.scratch)):
        if not values:
            continue
        what = {"d2": "upcycled budget D2", "d1": "dense budget D1", "scratch": "from-scratch budget"}[kind]
        ordered = sorted(values)
        between = {float(round(math.sqrt(a * b))): (a, b) for a, b in itertools.pairwise(ordered)}
        for v in sorted({max(values) * 2, max(values) * 4, min(values) / 2, *between}):
            if v <= MAX_TOKENS and v not in values:
                trunks = "dense trunk's trained part, then upcycled" if kind == "d1" else "trunk's trained part"
                where = (f" (between {between[v][0]:.4g} and {between[v][1]:.4g}: a branch from each {trunks})"
                         if v in between else "")
                out.append(Candidate(kind, f"{what} {v:.4g} tokens{where}", {"tokens": {kind: [float(v)]}}))
    named = [s for s in (spec.model.sizes or []) if isinstance(s, str)]
    if named and spec.model.dense is None:
        biggest = max(dense_params(NAMED_SIZES[s]) for s in named)
        larger = sorted((dense_params(shape), name) for name, shape in NAMED_SIZES.items()
                        if dense_params(shape) > biggest)
        for n, name in larger[:NEW_SIZES]:
            out.append(Candidate("size", f"dense size {name} (N1 = {n:,})", {"model": {"sizes": [name]}}))
    return out


def _in_group(values: Mapping[str, Any], group: dict[str, Any]) -> bool:
    """Whether an observation's or a table row's ``values`` belong to the upcycling ``group`` (the columns it sets)."""
    for c in GROUP_COLUMNS:
        want, have = group.get(c), values.get(c)
        if want is None or (isinstance(want, float) and math.isnan(want)):
            continue
        if have is None or (str(have) != str(want) if c == "method" else float(have) != float(want)):
            return False
    return True


@dataclass(frozen=True)
class _Target:
    """Whose D* the criterion narrows, and which planned observations are its two arms' rows: the dense->MoE
    upcycling's (from-scratch decays of the configurations its upcycled rows have, the group's upcycled decays), or
    an expansion study's (the m·E MoE's from-scratch decays, the study's expanded decays)."""

    up_kind: str  # "upcycled" | "expanded"
    configs: frozenset[tuple[float, float]]  # (n_expert, topk) of the from-scratch rows that count; empty: every one
    study: dict[str, Any] | None = None  # the expansion study's group (STUDY_COLUMNS)

    def scratch_row(self, n_expert: Any, topk: Any) -> bool:
        """Whether a from-scratch row of this configuration is one of the target's arm."""
        if not self.configs:
            return True
        return n_expert is not None and topk is not None and (int(n_expert), int(topk)) in self.configs

    def up_row(self, o: Any, group: dict[str, Any]) -> bool:
        if self.study is None:
            return _in_group({c: getattr(o, c) for c in GROUP_COLUMNS}, group)
        return all(getattr(o, c) == self.study.get(c) for c in STUDY_COLUMNS)


def _target(analysis: Analysis, tables: dict[str, pd.DataFrame], study: str | None,
            record_id: str) -> tuple[Analysis, dict[str, pd.DataFrame], _Target]:
    """The analysis, tables and rows the criterion works on: upcycling's, or the expansion study ``study``'s.
    SuggestError (422 at ``study``) for a study the analysis does not have; NotReady for one it could not analyse."""
    if study is None:
        return analysis, upcycling_tables(tables), _Target(
            "upcycled", frozenset(upcycling_configs(tables["scratch"], tables) or ()))
    found = next((e for e in analysis.expansions if e.label == study), None)
    if found is None:
        labels = ", ".join(repr(e.label) for e in analysis.expansions) or "none"
        raise SuggestError("study", f"study: analysis {record_id} has no expansion study {study!r}; it has {labels}")
    if found.analysis is None:
        raise NotReady(f"{study} was not analysed: " + "; ".join(m["why"] for m in found.missing))
    mapped = next(s for s in expansion_studies(tables) if s.label == study)
    g = found.group
    return found.analysis, mapped.tables, _Target(EXPANDED, frozenset({(g["n_expert"], g["topk"])}), g)


class _Problem:
    """The sweep, its analysis and the criterion, with the planner and store answering for candidates."""

    def __init__(self, services: Services, sweep_id: str, n1: float | None, study: str | None = None) -> None:
        self.services = services
        sweep = services.store.sweep(sweep_id)  # NotFoundError: 404
        if sweep.status == "cancelled":
            raise NotReady(f"sweep {sweep_id} was cancelled: submit it again (POST /sweeps or `upscale run`) before "
                           f"extending it")
        record = latest_analysis(services.store, sweep_id)
        if record is None:
            raise NotReady(f"{why_no_analysis(services, sweep_id)}; suggestions need one: run `upscale analyze "
                           f"{sweep_id}` (POST /sweeps/{sweep_id}/analysis)")
        self.record = record
        analysis, tables, self.target = _target(Analysis.from_json(record.record), sweep_tables(services, [sweep_id]),
                                                study, record.id)
        name = "D*_expand" if study else "D*"
        if analysis.scratch is None:
            raise NotReady(f"analysis {record.id}{f' ({study})' if study else ''} has no from-scratch MoE law, so no "
                           f"{name}: {analysis.missing('chinchilla')}")
        fitted = [u for u in analysis.upcycled if u.fit is not None]
        if not fitted:
            raise NotReady(f"analysis {record.id}{f' ({study})' if study else ''} has no {self.target.up_kind} law, "
                           f"so no {name}: {analysis.missing('joint')}")
        self.spec_data = sweep.spec
        self.spec = parse_spec(sweep.spec)
        self.n1 = float(n1 if n1 is not None else max(analysis.n1s))
        d_max = float(tables["upcycled"]["D2"].max()) if len(tables["upcycled"]) else 1e9
        d1_max = float(tables["upcycled"]["D1"].max()) if len(tables["upcycled"]) else 1e9
        best = min(fitted, key=lambda u: float(upcycled_loss(u.fit.fitted, self.n1, np.array([d1_max]),
                                                             np.array([d_max]))[0]))
        self.group, self.label = best.group, best.label
        self.moe, self.up = analysis.scratch.fitted, best.fit.fitted
        self.free = {"moe": free_params(self.moe.law, analysis.scratch.report.get("fixed") or {}),
                     "up": free_params(self.up.law, best.fit.report.get("fixed") or {})}
        # where the weighed law forms disagree most inside D*'s interval: the pair of runs that most narrows it
        self.forms_disagree = GroupAnswer.from_json(best.answer).at(self.n1)["next"] or None if best.answer else None
        first, samples = crossings_and_samples(self.moe, self.up, self.n1)
        self.dstar = first.dstar
        self.interval = percentile_interval(samples) if samples.size else None
        if not (math.isfinite(self.dstar) and self.dstar > 0):
            lead = "expanding" if study else "upcycling"
            raise NotReady(f"analysis {record.id} has no {name} at N1 = {self.n1:g}: the fitted laws do not cross "
                           f"there ({f'{lead} always wins' if self.dstar > 0 else 'from scratch always wins'}); "
                           f"choose another --n1")
        up_rows = pd.concat([rows for g, rows in upcycled_groups(tables["upcycled"]) if g == self.group]
                            or [tables["upcycled"].iloc[:0]])
        current, residuals, self.observed_rows = {}, {}, {}
        for key, fit, rows, columns in (("moe", self.moe, tables["scratch"], ("D", "N")),
                                        ("up", self.up, up_rows, ("D1", "D2", "N1"))):
            tab = {c: rows[c].to_numpy(dtype=float) for c in columns}
            loss = rows["loss"].to_numpy(dtype=float)
            pred, J = log_loss_jacobian(fit.law, fit.params, tab, self.free[key])
            current[key] = Rows(J, tuple(rows["trunk"].astype(str)))
            residuals[key] = np.log(loss) - np.log(pred)
            self.observed_rows[key] = Observed(fit.law, fit.params, self.free[key], tab, loss, current[key].trunks)
        self.noise = noise_from_fits([(residuals[k], current[k]) for k in current])
        for key, rows in self.predicted_rows(analysis.curves.get("rows", {})).items():
            current[key] = current[key] + rows  # what the curves already tell, weighed by their held-out error
        _, gradient = dstar_gradient(self.moe, self.up, self.n1, self.free["moe"], self.free["up"])
        if gradient is None:
            raise NotReady(f"D* at N1 = {self.n1:g} has no slope to follow: the fitted laws only touch there")
        self.criterion = DstarCriterion(gradient, current, self.noise)
        # observations by their coordinates, not their segment keys: a re-keyed decay (its trunk retrained because a
        # new branch point changed its key) repeats an observation the fit already has
        self.planned = plan(self.spec, self.services.settings.data_root_paths)
        self.observed = {s.observation for s in self.planned.observations()}
        self._new_flops: dict[frozenset[str], float] = {}

    def predicted_rows(self, tables: dict[str, list[dict[str, Any]]]) -> dict[str, Rows]:
        """The analysis's decay ends predicted from trunk curves (from scratch, and of the target group) as the
        criterion's rows: each with its family's held-out sd and its grid point, so that observing the point
        replaces the prediction and an action gains only what the curve did not already tell."""
        out = {}
        for key, kind, columns in (("moe", "scratch", ("D", "N")), ("up", self.target.up_kind, ("D1", "D2", "N1"))):
            rows = [r for r in tables.get(kind, []) if (self.target.scratch_row(r.get("n_expert"), r.get("topk"))
                                                        if kind == "scratch" else _in_group(r, self.group))]
            if rows:
                fit = self.moe if key == "moe" else self.up
                tab = {c: np.array([float(r[c]) for r in rows]) for c in columns}
                J = log_loss_jacobian(fit.law, fit.params, tab, self.free[key])[1]
                out[key] = Rows(J, tuple(str(r["trunk"]) for r in rows),
                                np.array([float(r["sd_pred"]) ** 2 for r in rows]),
                                tuple(_point(kind, {c: r[c] for c in columns}) for r in rows))
        return out

    def profile(self, level: float) -> ProfileInterval:
        """D*'s profile-likelihood interval at N1 from the same rows, noise and t quantile as the criterion."""
        return profile_interval(self.observed_rows["moe"], self.observed_rows["up"], self.n1, self.noise,
                                self.criterion.quantile(level), level)

    def merged(self, chosen: list[Candidate]) -> dict[str, Any]:
        additions: dict[str, Any] = {}
        for c in chosen:
            additions = merge(additions, c.additions)
        return additions

    def new_flops(self, chosen: list[Candidate]) -> float:
        """What the store does not hold of the spec plus ``chosen``: compare(store, plan(merged))'s new FLOPs."""
        key = frozenset(c.key for c in chosen)
        if key not in self._new_flops:
            p = plan(parse_spec(merge(self.spec_data, self.merged(chosen))), self.services.settings.data_root_paths)
            self._new_flops[key] = compare(self.services.store, p).figures()["new_flops"]
        return self._new_flops[key]

    def rows(self, c: Candidate) -> dict[str, Rows]:
        """The observations the candidate adds that inform D* at N1: new from-scratch decays and new decays of the
        target group, with their Jacobians at the fitted laws and the planner's trunks."""
        p = plan(parse_spec(merge(self.spec_data, c.additions)), self.services.settings.data_root_paths)
        new = [s for s in p.observations() if s.observation not in self.observed]
        return self.observation_rows([s for s in new if self.informs(s)])

    def informs(self, seg: PlannedSegment) -> bool:
        """Whether ``seg`` observes one of the two laws of D* at N1: a from-scratch decay of the target's
        configurations, or a decay of the group (of the expansion study)."""
        o = seg.observation
        return o is not None and ((o.kind == "scratch" and self.target.scratch_row(o.n_expert, o.topk)) or
                                  (o.kind == self.target.up_kind and self.target.up_row(o, self.group)))

    def unfinished(self) -> dict[str, tuple[list[PlannedSegment], float]]:
        """Per from-scratch or MoE trunk (of the target group) that the sweep has not finished: its planned
        observation segments still to train that inform D* at N1, and the FLOPs of all its segments still to train.
        Dense trunks and expansion parents are left out: MoE trunks grow from their decays, so stopping one stops more
        than itself."""
        kinds = {s.id: s.spec.kind for s in self.planned.segments}
        grown = {s.trunk for s in self.planned.segments if s.spec.kind in BUILD_KINDS}  # what builds branch off
        todo = [s for s in compare(self.services.store, self.planned).to_train()
                if kinds.get(s.trunk) in LEAF_TRUNKS and s.trunk not in grown]
        flops: dict[str, float] = {}
        informing: dict[str, list[PlannedSegment]] = {}
        for s in todo:
            flops[s.trunk] = flops.get(s.trunk, 0.0) + s.flops
            if self.informs(s):
                informing.setdefault(s.trunk, []).append(s)
        return {t: (informing[t], flops[t]) for t in sorted(informing)}  # other groups' trunks are theirs

    def observation_rows(self, segs: list[PlannedSegment]) -> dict[str, Rows]:
        """The criterion's rows of planned observations ``segs`` (from scratch, or of the target group)."""
        out = {}
        for key, fit, kind, columns in (("moe", self.moe, "scratch", ("D", "N")),
                                        ("up", self.up, self.target.up_kind, ("D1", "D2", "N1"))):
            mine = [s for s in segs if s.observation.kind == kind]
            if not mine:
                out[key] = Rows.empty(len(self.free[key]))
                continue
            tab = {col: np.array([float(_column(s.observation, col)) for s in mine]) for col in columns}
            out[key] = Rows(log_loss_jacobian(fit.law, fit.params, tab, self.free[key])[1],
                            tuple(s.trunk for s in mine), np.zeros(len(mine)),
                            tuple(_point(kind, {c: tab[c][i] for c in columns}) for i in range(len(mine))))
        return out

    def stop_advice(self) -> list[StopAdvice]:
        """The unfinished trunks whose planned decays would shrink D*'s sd by less than STOP_GAIN, costliest first."""
        out = []
        for trunk, (segs, flops) in self.unfinished().items():
            gain = sd_shrink(self.criterion, self.observation_rows(segs))
            if gain < STOP_GAIN:
                out.append(StopAdvice(trunk=trunk, pending_observations=len(segs), remaining_flops=flops,
                                      sd_shrink=max(gain, 0.0)))
        return sorted(out, key=lambda a: -a.remaining_flops)


def _point(kind: str, coords: dict[str, Any]) -> tuple[Any, ...]:
    """A grid point as the criterion keys it: a predicted row and the observation of the same point share it."""
    return (kind, *(float(v) for v in coords.values()))


def _column(o: Any, column: str) -> float:
    """An observation's value of a criterion column: from-scratch rows name their size N, the planner N1."""
    return o.N1 if column == "N" else getattr(o, column)


def suggest(services: Services, sweep_id: str, request: SuggestRequest, owner: str) -> Suggestion:
    """Ranked extensions of ``sweep_id`` (see the module); with ``request.apply`` the extension sweep too.
    NotFoundError for an unknown sweep, NotReady when it was cancelled or no analysis can answer, SuggestError when
    the budget buys no action."""
    problem = _Problem(services, sweep_id, request.n1, request.study)
    options = []
    for c in candidates(problem.spec):
        try:
            rows = problem.rows(c)
        except (SpecError, FitError):  # a budget the spec's schedule cannot hold: not an action
            continue
        if sum(len(r) for r in rows.values()):
            options.append((c, rows))
    rows_of = {c.key: rows for c, rows in options}
    by_key = {c.key: c for c, _ in options}
    criterion = problem.criterion
    sd_now, z = criterion.sd(), criterion.quantile(0.95)
    # the tolerance bounds the delta-method interval's hi / lo = exp(2·z·sd)
    target_sd = 0.0 if request.tolerance is None else math.log(request.tolerance) / (2 * z)

    def cost_of(chosen: list[str], key: str) -> float:
        before = [by_key[k] for k in chosen]
        return problem.new_flops([*before, by_key[key]]) - problem.new_flops(before)

    steps, stopped = greedy(criterion, list(by_key), rows_of.__getitem__, cost_of, request.budget_flops, target_sd,
                            limit=MAX_ACTIONS)
    if not steps and stopped == "budget":
        cheapest = min(cost_of([], k) for k in by_key)
        raise SuggestError("budget_flops", f"budget_flops {request.budget_flops:.3g} buys no extension that shrinks "
                                           f"the D* interval: the cheapest costs {cheapest:.3g} FLOPs; raise it")
    actions = [SuggestedAction(
        rank=i + 1, kind=by_key[s.action].kind, description=by_key[s.action].description,
        additions=by_key[s.action].additions, marginal_flops=s.cost,
        new_observations=sum(len(r) for r in rows_of[s.action].values()),
        expected_interval=list(delta_interval(problem.dstar, s.sd_after, z)))
        for i, s in enumerate(steps)]
    additions = problem.merged([by_key[s.action] for s in steps])
    profile = problem.profile(0.95)
    applied = extend(services, sweep_id, additions, owner) if request.apply and steps else None
    final_sd = steps[-1].sd_after if steps else sd_now
    return Suggestion(
        sweep_id=sweep_id, analysis_id=problem.record.id, group=problem.label, n1=problem.n1, dstar=problem.dstar,
        interval=[finite_or_none(v) for v in problem.interval] if problem.interval else None,
        delta_interval=list(delta_interval(problem.dstar, sd_now, z)),
        profile_interval=profile.ends(),
        noise=problem.noise.to_json(),
        budget_flops=request.budget_flops,
        total_flops=sum(s.cost for s in steps), stopped="tolerance" if stopped == "tolerance" or (
            request.tolerance is not None and final_sd <= target_sd) else stopped,
        expected_interval=list(delta_interval(problem.dstar, final_sd, z)),
        actions=actions, additions=additions, applied=applied, stop=problem.stop_advice(),
        forms_disagree=problem.forms_disagree)
