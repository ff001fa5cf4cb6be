"""The road that runs a sweep in-process (control/runs.py), on embedded Ray with the counting segment function
(tests/orchestrator/segment_fns.py): a spec is planned once however far it goes, a recorded sweep is not planned
again, and what the road tells its watch is what the plan estimates."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests.orchestrator.conftest import TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment
from upscale.control import runs
from upscale.control.services import LOCAL_OWNER
from upscale.control.sweeps import admit, submit
from upscale.control.wiring import open_services
from upscale.orchestrator.scheduler import Progress
from upscale.sweeps import planner
from upscale.sweeps.loader import load_spec

pytestmark = pytest.mark.usefixtures("ray_session")


@contextmanager
def planner_calls() -> Iterator[list[int]]:
    """How often `sweeps.planner.plan` runs on this thread (where the scheduler runs too) inside the block."""
    count = [0]

    def profile(frame, event, _arg):
        if event == "call" and frame.f_code is planner.plan.__code__:
            count[0] += 1

    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(None)


class Heard:
    """A `RunWatch` that keeps what it is told."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.estimates: list[runs.Estimates] = []
        self.events: list[Progress] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    @contextmanager
    def starting_ray(self, what: str) -> Iterator[None]:
        yield

    @contextmanager
    def tokenising(self, what: str) -> Iterator[Callable[[int, int], None]]:
        yield lambda done, total: None

    @contextmanager
    def sweep(self, label: str, estimates: runs.Estimates) -> Iterator[Callable[[Progress], None]]:
        self.estimates.append(estimates)
        yield self.events.append


def test_a_spec_is_planned_once_and_an_identical_one_is_returned(settings) -> None:
    services = open_services(settings, auth=False)
    spec = load_spec(TINY_SPEC)
    heard = Heard()
    with planner_calls() as calls:
        out, p = runs.run_spec(services, spec, heard, segment_fn=counting_segment)
    assert calls[0] == 1
    assert out.status == "done" and sorted(out.trained) == sorted(s.id for s in p.segments)
    assert len(services.store.observations(out.sweep_id)) == 11
    assert heard.estimates == [runs.Estimates(planner.segment_seconds(p), {s.id: s.tokens for s in p.segments})]
    assert heard.events and heard.events[-1].done == len(p.segments)

    again = Heard()
    with planner_calls() as calls:
        second, _ = runs.run_spec(services, spec, again, segment_fn=counting_segment)
    assert calls[0] == 1 and second.sweep_id == out.sweep_id and second.trained == []
    assert again.notes == [f"sweep {out.sweep_id} already has this identical spec (done): returning it; --new "
                           "records another"] and again.estimates == []  # nothing to train: no bar


def test_a_recorded_sweep_trains_without_being_planned_again(settings) -> None:
    """What an in-process `submit --wait` does: the sweep `submit` recorded, estimated from the store."""
    services = open_services(settings, auth=False)
    created = submit(services, admit(services, load_spec(TINY_SPEC).model_dump(mode="json")), LOCAL_OWNER)
    p = planner.plan(load_spec(TINY_SPEC))
    heard = Heard()
    with planner_calls() as calls:
        out = runs.run_recorded(services, created.id, heard, segment_fn=counting_segment)
    assert calls[0] == 0
    assert out.status == "done" and services.store.sweep(created.id).status == "done"
    assert len(services.store.observations(created.id)) == 11
    [estimates] = heard.estimates
    assert estimates.tokens == {s.id: s.tokens for s in p.segments}
    assert estimates.seconds == pytest.approx(planner.segment_seconds(p))
