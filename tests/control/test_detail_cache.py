"""GET /sweeps/{id}'s built answers are kept within UPSCALE_DETAIL_CACHE_BYTES: the least recently read go first, a
body larger than the whole bound is not kept, and a sweep read again after its answer was evicted is rebuilt and
kept again. On a real SQLite store with real sweeps."""

from __future__ import annotations

from upscale.control import sweeps
from upscale.control.detail_cache import Detail, DetailCache
from upscale.control.wiring import open_services
from upscale.orchestrator.settings import Settings
from upscale.sweeps.spec import parse_spec

SPEC = {"model": {"sizes": ["nano"]}, "moe": {"experts": [2], "topk": [1]}, "upcycling": {"methods": ["naive"]},
        "tokens": {"d1": [256], "d2": [128, 256]},
        "train": {"context": 16, "batch_size": 4, "lr": {"dense": 3e-3, "moe": 2e-3}, "warmup_tokens": 64}}


def test_the_least_recently_read_go_first_within_the_bytes() -> None:
    cache = DetailCache(max_bytes=10)
    for name in "abc":
        cache.put(name, Detail(1, b"xxxx", name))  # 4 bytes each: two fit
    assert cache.get("a") is None and cache.nbytes == 8
    cache.get("b")  # read: now the most recent
    cache.put("d", Detail(1, b"xxxx", "d"))
    assert cache.get("c") is None and cache.get("b") is not None and cache.get("d") is not None
    cache.put("b", Detail(2, b"y" * 11, "b"))  # larger than the whole bound: not kept, the old one dropped
    assert cache.get("b") is None and cache.nbytes == 4


def test_reading_many_sweeps_keeps_the_cache_within_its_bound(tmp_path) -> None:
    services = open_services(Settings(home=tmp_path, detail_cache_bytes=8_000), auth=False)
    ids = [sweeps.submit(services, parse_spec({**SPEC, "name": f"s{i}"}), "alice").id for i in range(6)]
    built = sum(len(sweeps.detail_json(services, sweep_id)[1]) for sweep_id in ids)
    assert built > 8_000 >= services.detail_cache.nbytes > 0
    assert services.detail_cache.get(ids[0]) is None  # evicted by the later ones
    etag, _ = sweeps.detail_json(services, ids[0])  # rebuilt, and kept again
    assert services.detail_cache.get(ids[0]).etag == etag
