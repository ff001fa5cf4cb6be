"""Data in segment identity, without torch: the planner fingerprints a user corpus and a Hugging Face tokenizer by
content (copies elsewhere plan the same keys, changed files new ones, the builtin corpus keeps its keys), remembers
file hashes by (path, size, mtime), takes the model's vocabulary from the tokenizer, and refuses what it cannot read."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.hf_data import DOCS, dataset, tokenizer_folder, tokenizer_json
from upscale.sweeps.data_sources import resolve_data, vocab_size_of
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import DataSpec
from upscale.sweeps.spec import SpecError, parse_spec


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default data cache (where the planner keeps file hashes) inside the test's folder."""
    monkeypatch.setenv("UPSCALE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _ids(spec_data: dict, data: dict) -> list[str]:
    return [s.id for s in plan(parse_spec({**spec_data, "data": data})).segments]


def test_the_same_files_anywhere_plan_the_same_keys_and_changed_files_new_ones(spec_data, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    dataset().save_to_disk(a / "corpus")
    tokenizer_folder(a / "tok")
    shutil.copytree(a, b)
    data_a = {"corpus": str(a / "corpus"), "text_field": "body", "tokenizer": str(a / "tok")}
    data_b = {"corpus": str(b / "corpus"), "text_field": "body", "tokenizer": str(b / "tok")}
    keys = _ids(spec_data, data_a)
    assert _ids(spec_data, data_b) == keys
    first = plan(parse_spec({**spec_data, "data": data_a})).segments[0].spec
    assert first.data.fingerprint and first.model.vocab_size == vocab_size_of(first.data) == 300
    assert _ids(spec_data, {**data_a, "text_field": "id"}) != keys  # the column read is identity too
    shutil.rmtree(b / "corpus")
    dataset(DOCS[:-1]).save_to_disk(b / "corpus")
    assert _ids(spec_data, data_b) != keys
    tokenizer_folder(b / "tok", vocab_size=290)  # the same corpus, another tokenizer
    assert _ids(spec_data, {**data_b, "corpus": str(a / "corpus")}) != keys


def test_builtin_corpus_and_tokenizers_keep_their_keys(spec_data) -> None:
    bpe = {"corpus": "builtin:python-stdlib", "tokenizer": "bpe", "bpe_vocab_size": 512}
    assert resolve_data(DataSpec(**bpe)).fingerprint is None
    assert _ids(spec_data, bpe) == _ids(spec_data, {**bpe, "fingerprint": "stale"})  # a stale value is cleared
    assert plan(parse_spec({**spec_data, "data": bpe})).segments[0].spec.model.vocab_size == 512


def test_absent_absolute_paths_plan_without_a_fingerprint(spec_data) -> None:
    """A corpus on a cluster's volume, not on the planning machine: planned by path, read by the workers."""
    data = {"corpus": "/no/such/volume/*.parquet", "text_field": "body"}
    assert plan(parse_spec({**spec_data, "data": data})).segments[0].spec.data.fingerprint is None


def test_file_hashes_are_remembered_by_path_size_and_mtime(tmp_path: Path, home: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    data = DataSpec(corpus=str(corpus))
    first = resolve_data(data).fingerprint
    (memo,) = (home / "cache" / "data" / "fingerprints").glob("*.json")
    assert json.loads(memo.read_text())["path"] == str(corpus.resolve())
    st = corpus.stat()
    corpus.write_text(corpus.read_text().replace("quick", "QUICK"))  # the same size...
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns))  # ...and mtime: the remembered hash is used, nothing read
    assert resolve_data(data).fingerprint == first
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert resolve_data(data).fingerprint != first


def test_vocab_size_of_each_tokenizer(tmp_path: Path) -> None:
    assert vocab_size_of(DataSpec()) == 256
    assert vocab_size_of(DataSpec(tokenizer="bpe", bpe_vocab_size=1000)) == 1000
    file = tokenizer_json(tmp_path / "tj", vocab_size=280)
    doc = json.loads(file.read_text())
    doc["added_tokens"].append({**doc["added_tokens"][0], "id": 300, "content": "<pad>"})  # ids past the BPE's
    file.write_text(json.dumps(doc))
    assert vocab_size_of(DataSpec(tokenizer=str(file))) == 301
    assert vocab_size_of(DataSpec(tokenizer=str(tokenizer_folder(tmp_path / "tf", vocab_size=280)))) == 280


def test_what_cannot_be_read_is_a_spec_error_naming_the_field(spec_data, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "no-tok").mkdir()
    (tmp_path / "no-tok" / "config.json").write_text("{}")
    (tmp_path / "bad.json").write_text("{\"model\": {}}")
    (tmp_path / "bad.xml").write_text("<text/>")
    cases = [
        ({"corpus": "HuggingFaceFW/fineweb"}, "data.corpus", "download it first"),
        ({"corpus": str(tmp_path / "empty")}, "data.corpus", "is empty"),
        ({"corpus": str(tmp_path / "*.parquet")}, "data.corpus", "matches no file"),
        ({"corpus": str(tmp_path / "bad.*")}, "data.corpus", "cannot read .xml files"),
        ({"tokenizer": str(tmp_path / "no-tok")}, "data.tokenizer", "holds no tokenizer"),
        ({"tokenizer": str(tmp_path / "bad.json")}, "data.tokenizer", "is not a tokenizers tokenizer.json"),
        ({"tokenizer": "gpt2"}, "data.tokenizer", "neither bytes, bpe nor a local path"),
    ]
    for data, field, message in cases:
        with pytest.raises(SpecError, match=message) as e:
            plan(parse_spec({**spec_data, "data": data}))
        assert [p[0] for p in e.value.problems] == [field], data


def _escapes(root: Path, outside: Path) -> dict[str, Path]:
    """Under ``root``: a corpus folder, a glob's folder and a tokenizer folder, each holding one symlink to an existing
    file outside the roots and its twin holding a dangling symlink; by name."""
    (outside / "secret.txt").write_text("private text\n")
    made = {}
    for target in ("exists", "dangling"):
        link = outside / ("secret.txt" if target == "exists" else "missing.txt")
        for kind, name in (("folder", "only.txt"), ("glob", "only.txt"), ("tok", "tokenizer.json")):
            folder = root / f"{kind}-{target}"
            folder.mkdir(parents=True)
            (folder / name).symlink_to(link)
            made[f"{kind}-{target}"] = folder
    return made


def test_a_symlinked_file_out_of_the_roots_is_refused_alike_whether_its_target_exists(tmp_path: Path, home) -> None:
    """A server's planning (`roots`) resolves every entry a corpus walk, a glob or a tokenizer folder yields: a link to
    an existing outside file and a dangling one get the one refusal, and nothing outside is hashed."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    made = _escapes(root, outside)
    answers = {}
    for name, folder in made.items():
        if name.startswith("tok"):
            data, field = DataSpec(tokenizer=str(folder)), "data.tokenizer"
        else:
            data = DataSpec(corpus=str(folder / "*.txt") if name.startswith("glob") else str(folder))
            field = "data.corpus"
        with pytest.raises(SpecError) as e:
            resolve_data(data, roots=[root])
        answers[name] = e.value.problems
        assert e.value.problems[0][0] == field and "under the data roots" in e.value.problems[0][1]
    for kind in ("folder", "glob", "tok"):
        assert answers[f"{kind}-exists"] == answers[f"{kind}-dangling"], kind
    assert not (home / "cache" / "data" / "fingerprints").exists()  # the outside file was never hashed
    assert resolve_data(DataSpec(corpus=str(made["folder-exists"]))).fingerprint  # unconfined (the CLI): read
