"""Segment identity: content keys that change with every identity field and never with runtime placement."""

import json

import pytest
from pydantic import ValidationError

from upscale.sweeps.segments import DataSpec, ModelSpec, OptimSpec, ScheduleSpec, SegmentSpec, canonical_json


def _trunk(**overrides: object) -> SegmentSpec:
    fields: dict[str, object] = {
        "kind": "dense_trunk",
        "model": ModelSpec(n_layer=2, d_model=32, n_head=2, vocab_size=256, context=16),
        "data": DataSpec(),
        "optim": OptimSpec(lr=3e-3, batch_size=4),
        "schedule": ScheduleSpec(warmup_tokens=128),
        "end_tokens": 640,
        "save_at_tokens": (320, 576),
    }
    fields.update(overrides)
    return SegmentSpec(**fields)


def test_id_is_stable_and_content_addressed() -> None:
    a, b = _trunk(), _trunk()
    assert a.id == b.id and len(a.id) == 16
    assert _trunk(seed=1).id != a.id
    assert _trunk(optim=OptimSpec(lr=2e-3, batch_size=4)).id != a.id


def test_integral_floats_hash_as_ints() -> None:
    # 2.0e5 read from YAML and 200000 written in Python are the same budget.
    assert canonical_json({"d": 2.0e5}) == canonical_json({"d": 200000})


def test_round_trip_through_json_keeps_the_id() -> None:
    a = _trunk()
    assert SegmentSpec.model_validate_json(a.model_dump_json()).id == a.id


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"end_tokens": 650}, "end_tokens=650 is not a multiple of batch_size·context=64"),
        ({"save_at_tokens": (576, 320)}, "save_at_tokens must be strictly increasing"),
        ({"save_at_tokens": (704,)}, "must be multiples of 64 within"),
        ({"decay_start_tokens": 320}, "trunks never decay"),
        ({"start_tokens": 320, "save_at_tokens": (576,)}, "continues the piece before it; parent_ids must name it"),
    ],
)
def test_bad_token_bookkeeping_is_refused(overrides: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _trunk(**overrides)


def test_decay_branch_needs_a_decay_start_inside_it() -> None:
    with pytest.raises(ValidationError, match="decay_start_tokens=None must be a step multiple"):
        _trunk(kind="dense_decay", save_at_tokens=())
    ok = _trunk(kind="dense_decay", save_at_tokens=(), start_tokens=576, decay_start_tokens=576)
    assert ok.tokens_per_step == 64


def test_topk_above_experts_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"topk=3 is not valid for n_expert=2; valid: 1\.\.2"):
        ModelSpec(n_layer=2, d_model=32, n_head=2, vocab_size=256, context=16, n_expert=2, topk=3)


def test_one_expert_is_neither_dense_nor_moe() -> None:
    base = {"n_layer": 2, "d_model": 32, "n_head": 2, "vocab_size": 256, "context": 16}
    with pytest.raises(ValidationError, match="n_expert=1: an MoE has at least 2 experts"):
        ModelSpec(**base, n_expert=1, topk=1)
    assert ModelSpec(**base, n_expert=2, topk=1).is_moe and not ModelSpec(**base).is_moe


def test_dispatch_is_never_hashed_and_routing_only_where_it_changes_the_computation() -> None:
    base = {"n_layer": 2, "d_model": 32, "n_head": 2, "vocab_size": 64, "context": 16}

    def fields(**kw: object) -> set[str]:
        return set(json.loads(canonical_json(ModelSpec(**base, **kw))))

    old = set(base) | {"n_expert", "topk", "aux_loss_coef", "router_init", "init_std"}  # the fields before routing
    assert fields() == old  # dense
    assert fields(n_expert=4, topk=2) == fields(n_expert=4, topk=2, routing="deepspeed", dispatch="deepspeed") == old
    assert fields(n_expert=4, topk=1, routing="deepspeed") == old  # what top-1 computed before
    assert fields(n_expert=4, topk=1) == old | {"routing"}  # the new default top-1: a new computation, a new key
    ids = {ModelSpec(**base, n_expert=4, topk=1, dispatch=d).model_dump_json() for d in ("grouped", "deepspeed")}
    assert len(ids) == 2  # still recorded, only not hashed


def test_imported_shape_fields_are_hashed_only_away_from_their_defaults() -> None:
    base = {"n_layer": 2, "d_model": 32, "n_head": 4, "vocab_size": 64, "context": 16}
    key = _trunk(model=ModelSpec(**base)).id

    def fields(**kw: object) -> set[str]:
        return set(json.loads(canonical_json(ModelSpec(**base, **kw))))

    # the defaults spelled out are the default: the same key as a spec that never names them
    spelled = ModelSpec(**base, ffn_width=128, n_kv_head=4, tie_embeddings=False, norm_eps=1e-5, rope_theta=1e4)
    assert _trunk(model=spelled).id == key and spelled.ffn_width is None and spelled.n_kv_head is None
    for kw in ({"ffn_width": 96}, {"n_kv_head": 2}, {"tie_embeddings": True}, {"norm_eps": 1e-6},
               {"rope_theta": 5e5}):
        assert fields(**kw) == fields() | set(kw)
        assert _trunk(model=ModelSpec(**base, **kw)).id != key
    with pytest.raises(ValidationError, match="n_kv_head=3 does not divide n_head=4"):
        ModelSpec(**base, n_kv_head=3)


@pytest.mark.parametrize(("kind", "model", "key"), [
    ("dense_trunk", {}, "43e27eae4cbd4648"),
    ("scratch_trunk", {"n_expert": 4, "topk": 1}, "144d17d9f309db54"),
    ("scratch_trunk", {"n_expert": 4, "topk": 2, "routing": "deepspeed"}, "de1b6225c9dae16f"),
    ("scratch_trunk", {"n_expert": 8, "topk": 1, "routing": "deepspeed", "aux_loss_coef": 0.01}, "48588a680857b6cd"),
])
def test_keys_are_pinned(kind: str, model: dict, key: str) -> None:
    """Stored segments are found by these keys: a schema refactoring must leave them as they are (a change in what a
    segment computes bumps TRAINING_SEMANTICS instead)."""
    spec = _trunk(kind=kind, model=ModelSpec(n_layer=2, d_model=32, n_head=2, vocab_size=256, context=16, **model))
    assert spec.id == key
