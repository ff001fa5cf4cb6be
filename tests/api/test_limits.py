"""Bounded work per request, on a live server: a grid over UPSCALE_MAX_SEGMENTS is refused before planning while
/healthz keeps answering, a body over UPSCALE_MAX_BODY_BYTES is 413 and stores nothing, YAML aliases, deep nesting,
infinities and integers the store cannot hold are small 422s with field paths, data.corpus (a glob's matches too),
data.tokenizer and model.dense.path are confined to the data roots with one answer whether or not a path exists, and
resources the cluster lacks are refused at submit. No background loops: nothing trains."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import Live, serve
from upscale.orchestrator.settings import Settings
from upscale.sweeps.segments import MAX_TOKENS

SPEC = {"name": "limits", "model": {"sizes": ["nano"]}, "moe": {"experts": [2], "topk": [1]},
        "upcycling": {"methods": ["naive"]}, "tokens": {"d1": [256], "d2": [128, 256]},
        "train": {"context": 16, "batch_size": 4, "lr": {"dense": 3e-3, "moe": 2e-3}, "warmup_tokens": 64},
        "resources": {"cpus": 1}}
MAX_SEGMENTS = 3000


@pytest.fixture(scope="module")
def server(tmp_path_factory, mlflow_uri) -> Iterator[Live]:
    home = tmp_path_factory.mktemp("home")
    (home / "data").mkdir()
    settings = Settings(home=home, mlflow_tracking_uri=mlflow_uri, max_segments=MAX_SEGMENTS,
                        max_body_bytes=64 * 1024)
    with serve(settings, scheduler=False) as live:
        yield live


def _sweep_count(live: Live) -> int:
    with live.client() as c:
        return len(c.get("/sweeps").json())


def _grid(experts: int, budgets: int, name: str) -> dict:
    """A grid of 1 size x ``experts`` x topk {1, 2} x 2 methods x ``budgets`` D1 x ``budgets`` D2."""
    return {**SPEC, "name": name, "moe": {"experts": list(range(2, 2 + experts)), "topk": [1, 2]},
            "upcycling": {"methods": ["naive", "noise"]},
            "tokens": {"d1": [256 * (i + 1) for i in range(budgets)], "d2": [256 * (i + 1) for i in range(budgets)]}}


def _healthz_while(live: Live, request) -> tuple[httpx.Response, int]:
    """``request()`` in a thread while /healthz is asked, each within 1 s, until it returns: (its response, how many
    /healthz answers came)."""
    out: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: out.append(request()))
    thread.start()
    answers = 0
    with httpx.Client(base_url=live.url, timeout=1.0) as c:
        while thread.is_alive() or answers == 0:
            assert c.get("/healthz").status_code == 200  # httpx raises if it takes over 1 s
            answers += 1
    thread.join()
    return out[0], answers


def test_a_million_point_grid_is_refused_before_planning(server) -> None:
    before = _sweep_count(server)
    with server.client() as c:
        r, answers = _healthz_while(server, lambda: c.post("/sweeps", json=_grid(100, 50, "huge")))
    assert r.status_code == 422, r.text
    (problem,) = r.json()["detail"]
    assert problem["loc"] == ["body"]
    assert "2,020,100 segments" in problem["msg"] and f"{MAX_SEGMENTS:,}" in problem["msg"]
    assert "UPSCALE_MAX_SEGMENTS" in problem["msg"] and "moe.experts" in problem["msg"]
    assert answers >= 1 and _sweep_count(server) == before


def test_a_large_grid_plans_off_the_event_loop(server) -> None:
    """~2,200 segments plan and are stored while /healthz keeps answering within 1 s."""
    with server.client() as c:
        r, answers = _healthz_while(server, lambda: c.post("/sweeps", json=_grid(4, 8, "large")))
    assert r.status_code == 201, r.text
    assert 2000 < r.json()["plan"]["segments"] <= MAX_SEGMENTS and answers >= 1


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_413_and_nothing_is_stored(server, chunked) -> None:
    before = _sweep_count(server)
    body = json.dumps({**SPEC, "description": "x" * (50 << 20)}).encode()
    content = (body[i:i + (1 << 20)] for i in range(0, len(body), 1 << 20)) if chunked else body
    with server.client() as c:
        try:
            r = c.post("/sweeps", content=content, headers={"content-type": "application/json"})
        except httpx.WriteError:  # the server answered and closed before the client finished sending
            pytest.fail("the server closed the connection without a 413")
    assert r.status_code == 413 and "UPSCALE_MAX_BODY_BYTES" in r.json()["detail"]
    assert _sweep_count(server) == before
    with server.client() as c:  # a model-parsed body too
        r = c.post("/fits", content=b'{"law": "' + b"x" * (100 << 10) + b'"}', headers={"content-type":
                                                                                       "application/json"})
    assert r.status_code == 413


BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
name: [*i]
"""


def test_yaml_alias_bomb_is_a_small_422(server) -> None:
    with server.client() as c:
        r = c.post("/sweeps", content=BILLION_LAUGHS, headers={"content-type": "application/yaml"})
    assert r.status_code == 422 and len(r.content) < 2048
    assert "YAML aliases are not allowed in a spec" in r.json()["detail"][0]["msg"]


def _post_raw(live: Live, text: str, yaml: bool = False) -> httpx.Response:
    with live.client() as c:
        return c.post("/sweeps", content=text, headers={"content-type": "application/yaml" if yaml else
                                                        "application/json"})


def _locs(r: httpx.Response) -> list[list]:
    assert r.status_code == 422, r.text
    return [d["loc"] for d in r.json()["detail"]]


def test_infinities_and_nans_are_422_with_field_paths(server) -> None:
    spec = json.dumps(SPEC)
    assert ["body", "tokens", "d1", 0] in _locs(_post_raw(server, spec.replace('"d1": [256]', '"d1": [Infinity]')))
    assert ["body", "train", "lr", "dense"] in _locs(_post_raw(server, spec.replace('"dense": 0.003',
                                                                                    '"dense": Infinity')))
    assert ["body", "train", "warmup_tokens"] in _locs(_post_raw(server, spec.replace('"warmup_tokens": 64',
                                                                                      '"warmup_tokens": NaN')))
    yaml_text = json.dumps(SPEC).replace('"d2": [128, 256]', '"d2": [128, .inf]')
    assert ["body", "tokens", "d2", 1] in _locs(_post_raw(server, yaml_text, yaml=True))
    with server.client() as c:
        r = c.post("/fits", content='{"law": "power-d2", "kind": "upcycled", "rows": [{"D2": Infinity, "loss": 1}]}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:3] == ["body", "rows", 0]


def test_counts_beyond_the_store_are_422_with_field_paths(server) -> None:
    spec = json.dumps(SPEC)
    r = _post_raw(server, spec.replace('"d1": [256]', '"d1": [1e30]'))
    assert ["body", "tokens", "d1", 0] in _locs(r) and f"{MAX_TOKENS}" in json.dumps(r.json())
    r = _post_raw(server, spec.replace('"d2": [128, 256]', f'"d2": [128, {10**30}]'))
    assert ["body", "tokens", "d2", 1] in _locs(r) and "beyond what the store holds" in r.text
    r = _post_raw(server, spec.replace('"experts": [2]', '"experts": [2, 4294967296]'))
    assert ["body", "moe", "experts", 1] in _locs(r)


@pytest.mark.parametrize("yaml", [False, True])
def test_deep_nesting_is_422(server, yaml) -> None:
    deep = "[" * 3000 + "]" * 3000
    r = _post_raw(server, '{"name": "deep", "description": ' + deep + "}", yaml=yaml)
    assert r.status_code == 422 and "deeper than 64" in r.text
    nested = '{"a": ' * 100 + "1" + "}" * 100
    r = _post_raw(server, '{"name": "deep", "model": ' + nested + "}", yaml=yaml)
    (loc,) = [loc for loc in _locs(r) if loc[:2] == ["body", "model"]]
    assert loc[2:] == ["a"] * 64 and "deeper than 64" in r.text


@pytest.mark.parametrize("path", ["/fits", "/sweeps/anything/extend", "/refit-schedules"])
def test_deep_json_in_a_parsed_body_is_422(server, path) -> None:
    """Routes whose body FastAPI parses: the parser's RecursionError is a 422 at `body`, not a 400 or a 500."""
    with server.client() as c:
        r = c.post(path, content='{"law": ' + "[" * 5000 + "]" * 5000 + "}",
                   headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body"], r.text


def test_error_messages_quote_only_an_excerpt(server) -> None:
    huge = "s" * 20000
    r = _post_raw(server, json.dumps({**SPEC, "model": {"sizes": [huge]}, "upcycling": {"methods": [huge]}}))
    assert r.status_code == 422 and len(r.content) < 2048, len(r.content)
    with server.client() as c:
        r = c.post("/fits", json={"law": "power-d2", "kind": huge, "rows": []})
    assert r.status_code == 422 and len(r.content) < 2048, len(r.content)


@pytest.fixture
def outside(tmp_path) -> Path:
    """A real folder and file outside the data roots."""
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "notes.txt").write_text("private\n")
    return tmp_path / "secret"


def _escaping_folders(root: Path, outside: Path) -> list[Path]:
    """Corpus folders under ``root`` whose one file is a symlink out of the roots: to an existing file, dangling."""
    folders = []
    for name, target in (("corpB", outside / "notes.txt"), ("corpC", outside / "missing.txt")):
        shutil.rmtree(root / name, ignore_errors=True)
        (root / name).mkdir()
        (root / name / "only.txt").symlink_to(target)
        folders.append(root / name)
    return folders


def test_corpus_outside_the_data_roots_is_one_identical_422(server, outside) -> None:
    """Named outside, reached through `..`, `~` or a symlinked folder, or a folder under the roots whose file is a
    symlink out of them, to an existing file or dangling: one answer, which tells nothing of what exists."""
    root = server.settings.data_root_paths[0]
    (root / "escape").unlink(missing_ok=True)
    (root / "escape").symlink_to(outside)
    corpora = ["../../etc/passwd", "/etc", "/etc/passwd", str(outside), str(outside / "notes.txt"),
               str(outside / "missing"), "/no/such/folder", str(root / "escape"), str(root / "escape" / "notes.txt"),
               f"{root}/../secret", "builtin:../../etc", "relative/under", "~",
               *(str(f) for f in _escaping_folders(root, outside))]
    answers = []
    for corpus in corpora:
        r = _post_raw(server, json.dumps({**SPEC, "data": {"corpus": corpus}}))
        assert r.status_code == 422, (corpus, r.text)
        answers.append(r.json())
    assert all(a == answers[0] for a in answers), answers
    assert not _hashed(server, outside)


def _hashed(live: Live, outside: Path) -> list[Path]:
    """The server's remembered file hashes that name a file under ``outside``: what it has read there."""
    return [f for f in (live.settings.data_cache_dir / "fingerprints").glob("*.json") if str(outside) in f.read_text()]


def test_extend_confines_a_corpus_folder_with_a_file_linked_out_of_the_roots(server, outside) -> None:
    """`POST /sweeps/{id}/extend` plans the merged spec through the same confinement as a submission."""
    root = server.settings.data_root_paths[0]
    r = _post_raw(server, json.dumps({**SPEC, "name": "to-extend"}))
    assert r.status_code == 201, r.text
    answers = []
    with server.client() as c:
        for folder in _escaping_folders(root, outside):
            e = c.post(f"/sweeps/{r.json()['id']}/extend", json={"additions": {"data": {"corpus": str(folder)}}})
            assert e.status_code == 422 and _locs(e) == [["body", "data", "corpus"]], e.text
            answers.append(e.json())
    assert answers[0] == answers[1] and "under the data roots" in answers[0]["detail"][0]["msg"]
    assert not _hashed(server, outside)
    (problem,) = answers[0]["detail"]
    assert problem["loc"] == ["body", "data", "corpus"] and str(root) in problem["msg"]
    assert "builtin:" in problem["msg"] and "UPSCALE_DATA_ROOTS" in problem["msg"]


def test_corpus_under_a_data_root_is_accepted_if_it_is_there(server) -> None:
    """A corpus under the roots is read there; one missing there is a 422 at data.corpus saying so, not a sweep that
    fails once its first segment looks for it (the roots are the server's own folders)."""
    root = server.settings.data_root_paths[0]
    (root / "texts").mkdir(exist_ok=True)
    (root / "texts" / "a.txt").write_text("some text\n")  # planning reads it: an empty corpus is refused
    r = _post_raw(server, json.dumps({**SPEC, "name": "rooted", "data": {"corpus": str(root / "texts")}}))
    assert r.status_code == 201, r.text
    before = _sweep_count(server)
    for corpus in (str(root / "not-yet-there"), str(root / "not-yet-there" / "*.txt")):
        r = _post_raw(server, json.dumps({**SPEC, "name": "missing", "data": {"corpus": corpus}}))
        assert r.status_code == 422 and _locs(r) == [["body", "data", "corpus"]], r.text
        assert "does not exist under the data roots" in r.json()["detail"][0]["msg"]
    assert _sweep_count(server) == before


def test_tokenizer_and_glob_matches_are_confined_to_the_data_roots(server, outside) -> None:
    root = server.settings.data_root_paths[0]
    (root / "globbed").mkdir(exist_ok=True)
    (root / "globbed" / "escape.txt").unlink(missing_ok=True)
    (root / "globbed" / "escape.txt").symlink_to(outside / "notes.txt")
    (root / "escape").unlink(missing_ok=True)
    (root / "escape").symlink_to(outside)
    r = _post_raw(server, json.dumps({**SPEC, "data": {"corpus": str(root / "globbed" / "*.txt")}}))
    assert r.status_code == 422 and _locs(r) == [["body", "data", "corpus"]], r.text
    for tokenizer in (str(outside), "relative/tok", str(root / "escape")):
        r = _post_raw(server, json.dumps({**SPEC, "data": {"tokenizer": tokenizer}}))
        assert r.status_code == 422 and _locs(r) == [["body", "data", "tokenizer"]], r.text
        assert r.json()["detail"][0]["msg"].startswith("must be bytes, bpe or an absolute path under the data roots")


def test_resources_the_cluster_lacks_are_refused_at_submit(server, ray_session) -> None:
    have = ray_session.cluster_resources()["CPU"]
    r = _post_raw(server, json.dumps({**SPEC, "name": "too-big", "resources": {"cpus": 64}}))
    assert ["body", "resources", "cpus"] in _locs(r)
    assert f"the cluster has {have:g}" in r.text
    r = _post_raw(server, json.dumps({**SPEC, "name": "gpu", "resources": {"cpus": 1, "gpus": 1}}))
    assert ["body", "resources", "gpus"] in _locs(r)
    assert _post_raw(server, json.dumps({**SPEC, "name": "fits"})).status_code == 201


def test_a_model_no_node_can_hold_is_refused_at_submit_with_its_estimate(server, ray_session) -> None:
    """The memory estimate reads the largest node's memory from Ray: 64 copies of a 1B model's FFN (52e9 parameters,
    ~780 GiB of weights and AdamW state) is refused with what it is made of, and nothing is stored."""
    before = _sweep_count(server)
    big = {**SPEC, "name": "huge-moe", "model": {"sizes": ["1B"]}, "moe": {"experts": [64], "topk": [1]}}
    r = _post_raw(server, json.dumps(big))
    assert _locs(r) == [["body", "resources"]]
    msg = r.json()["detail"][0]["msg"]
    assert "1B as 64x1 needs about" in msg and "52,392,040,032 parameters" in msg and "the largest node has" in msg
    assert _sweep_count(server) == before


def test_a_ten_star_glob_is_refused_before_any_walk(server) -> None:
    """Each `**` multiplies the walk by the tree: a glob holds one. The 54-byte glob is refused by the spec's rule,
    before the data roots or the disk are looked at."""
    root = server.settings.data_root_paths[0]
    glob = f"{root}/" + "**/" * 10 + "*"
    r = _post_raw(server, json.dumps({**SPEC, "name": "stars", "data": {"corpus": glob}}))
    assert _locs(r) == [["body", "data", "corpus"]]
    assert "at most 1 `**` (this one has 10)" in r.json()["detail"][0]["msg"]


def test_a_glob_over_the_file_cap_is_refused(server, monkeypatch) -> None:
    from upscale.sweeps import data_sources

    root = server.settings.data_root_paths[0]
    (root / "many").mkdir(exist_ok=True)
    for i in range(5):
        (root / "many" / f"{i}.txt").write_text("text\n")
    monkeypatch.setattr(data_sources, "MAX_CORPUS_FILES", 4)
    r = _post_raw(server, json.dumps({**SPEC, "name": "many", "data": {"corpus": f"{root}/many/**/*.txt"}}))
    assert _locs(r) == [["body", "data", "corpus"]]
    assert "has over 4 files" in r.json()["detail"][0]["msg"]
    monkeypatch.setattr(data_sources, "MAX_CORPUS_FILES", 5)
    assert _post_raw(server, json.dumps({**SPEC, "name": "many", "data": {"corpus": f"{root}/many/*.txt"}})) \
        .status_code == 201


def test_infinities_in_other_bodies_are_422_with_field_paths(server) -> None:
    schedule = '{"name": "s", "trigger": "on_new_observations", "request": {"sweep_ids": ["x"], "n1": Infinity}}'
    with server.client() as c:
        r = c.post("/refit-schedules", content=schedule, headers={"content-type": "application/json"})
        assert ["body", "request", "n1"] in _locs(r)
        r = c.post("/fits", content='{"law": "power-d2", "kind": "upcycled", "rows": [{"D2": 1, "loss": 1}], '
                   '"fixed": {"E": NaN}}', headers={"content-type": "application/json"})
        assert ["body", "fixed", "E"] in _locs(r)


def _dense_spec(name: str, path: str) -> dict:
    """SPEC started from the model directory at ``path`` instead of trained dense sizes."""
    return {**SPEC, "name": name, "model": {"dense": {"path": path, "trained_tokens": 4096}},
            "tokens": {"d2": [128, 256]}, "train": {**SPEC["train"], "lr": {"moe": 2e-3}}}


def _model_dir(path: Path) -> Path:
    """A dense model directory as the planner reads it (config.json, and the weights' bytes it hashes)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"n_layer": 1, "d_model": 32, "n_head": 2, "vocab_size": 256,
                                                  "context": 64}))
    (path / "weights.pt").write_bytes(b"weights")
    return path


def test_a_dense_model_outside_the_data_roots_is_one_identical_422_and_never_read(server, outside) -> None:
    """Named outside, or a folder under the roots whose weights link out of them, to a file or nowhere."""
    model = _model_dir(outside / "model")  # a real model directory: accepted if it were read
    linked = []
    for name, target in (("linked", model / "weights.pt"), ("dangling", outside / "missing.pt")):
        folder = server.settings.data_root_paths[0] / "models" / name
        shutil.rmtree(folder, ignore_errors=True)
        _model_dir(folder)
        (folder / "weights.pt").unlink()
        (folder / "weights.pt").symlink_to(target)
        linked.append(str(folder))
    answers = []
    for path in (str(model), str(outside / "missing"), "/etc", "relative/model", *linked):
        r = _post_raw(server, json.dumps(_dense_spec("outside", path)))
        assert r.status_code == 422, (path, r.text)
        answers.append(r.json())
    assert all(a == answers[0] for a in answers), answers
    (problem,) = answers[0]["detail"]
    assert problem["loc"] == ["body", "model", "dense", "path"] and "UPSCALE_DATA_ROOTS" in problem["msg"]


def test_a_dense_model_under_a_data_root_is_planned(server) -> None:
    model = _model_dir(server.settings.data_root_paths[0] / "models" / "mine")
    r = _post_raw(server, json.dumps(_dense_spec("imported", str(model))))
    assert r.status_code == 201, r.text
    assert r.json()["plan"]["by_kind"]["dense_import"]["count"] == 1


def test_the_tokenizer_of_an_imported_model_is_confined_before_its_vocabulary_is_read(server, outside) -> None:
    model = _model_dir(server.settings.data_root_paths[0] / "models" / "vocab")
    (outside / "tokenizer.json").write_text("not json")  # read, it would be refused as a broken tokenizer instead
    spec = {**_dense_spec("vocab", str(model)), "data": {"tokenizer": str(outside / "tokenizer.json")}}
    r = _post_raw(server, json.dumps(spec))
    assert r.status_code == 422, r.text
    (problem,) = r.json()["detail"]
    assert problem["loc"] == ["body", "data", "tokenizer"] and "UPSCALE_DATA_ROOTS" in problem["msg"]
