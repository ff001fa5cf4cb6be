"""What a user can get wrong gives one `error:` line and exit 2, never a traceback: an `--api` nobody listens on, a
server that never answers, a missing token (and the token taken from UPSCALE_TOKEN), a bad spec path, a path through
a regular file, a missing mlflow for `upscale ui --launch`. Plus `--version`, shell completion and the `ui` command.

Every case runs the installed console script in a subprocess; the server is the real uvicorn of tests/api/conftest.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import upscale
from tests.api.conftest import free_port
from tests.api.test_cli import UPSCALE, _cli, _env
from tests.api.test_flow import FLOW_SPEC
from tests.sweeps.conftest import SMALL_SPEC
from upscale.fitting.synthetic import bundled_path


def _fails(env: dict[str, str], *args: str) -> str:
    """Run the CLI; it must exit 2 with exactly one line, `error: ...`, on stderr. Returns that line."""
    r = subprocess.run([UPSCALE, *args], env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.fixture
def env(tmp_path, mlflow_uri) -> dict[str, str]:
    return _env(tmp_path, mlflow_uri)


def test_an_api_nobody_listens_on(env) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # bound once, then closed: the connection is refused
    line = _fails(env, "status", "--api", url)
    assert f"is `upscale serve` running at {url}?" in line


def test_a_server_that_never_answers(env) -> None:
    with socket.socket() as listener:  # accepts connections (the kernel's backlog) but never replies
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        line = _fails({**env, "UPSCALE_TIMEOUT": "1"}, "status", "--api", url)
    assert "no answer within 1 s" in line and "UPSCALE_TIMEOUT" in line


def test_an_api_url_without_a_scheme(env) -> None:
    assert "give one like http://127.0.0.1:8000" in _fails(env, "status", "--api", "127.0.0.1:8000")


@pytest.mark.parametrize("case", ["missing spec", "folder as spec", "submit a folder", "plot under a file",
                                  "home under a file"])
def test_bad_paths(case: str, env, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    under_a_file = str(a_file / "x")  # NotADirectoryError even for root, whom permissions do not stop
    args, expected = {
        "missing spec": (["run", "/no/such/spec.yaml"], "no such spec file: /no/such/spec.yaml"),
        "folder as spec": (["run", str(tmp_path)], f"{tmp_path} is a folder, not a spec file"),
        "submit a folder": (["submit", str(tmp_path)], f"{tmp_path}: Is a directory; that is a folder: give a file"),
        "plot under a file": (["fit", "--law", "joint", "--data", str(bundled_path("upcycled")), "--plot",
                               under_a_file], f"{under_a_file}: Not a directory; a part of the path is a file"),
        "home under a file": (["sweeps"], f"{under_a_file}: Not a directory"),
    }[case]
    if case == "home under a file":
        env = {**env, "UPSCALE_HOME": under_a_file}
    assert expected in _fails(env, *args)


@pytest.mark.slow  # ~8 s on CI's 2 cores (make test stays under 10 minutes)
def test_reads_take_the_token_from_the_environment(live, env) -> None:
    read_token = live.read["Authorization"].removeprefix("Bearer ")
    line = _fails(env, "status", "--api", live.url)  # env has UPSCALE_TOKEN=""
    assert "401" in line and "pass a token: --token or UPSCALE_TOKEN" in line
    assert "the token is not one this server issued" in _fails(env, "status", "--api", live.url, "--token", "nope")
    header = _cli({**env, "UPSCALE_TOKEN": read_token}, "status", "--api", live.url).splitlines()[1]
    assert "sweep" in header and "owner" in header  # the table's header: the read succeeded
    spec = Path(env["UPSCALE_HOME"]) / "flow.yaml"
    spec.write_text(FLOW_SPEC)
    line = _fails({**env, "UPSCALE_TOKEN": read_token}, "submit", str(spec), "--api", live.url)
    assert "403" in line and "upscale token create --scope write" in line


def test_version_and_completion(env) -> None:
    assert _cli(env, "--version").strip() == f"upscale {upscale.__version__}"
    script = _cli({**env, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}, "--show-completion", "bash")
    assert "_UPSCALE_COMPLETE=complete_bash" in script
    # What bash asks when the user types `upscale sta<TAB>`:
    completion = _cli({**env, "_UPSCALE_COMPLETE": "complete_bash", "COMP_WORDS": "upscale sta", "COMP_CWORD": "1"})
    assert completion.split() == ["status"]


def test_ui_runs_mlflow_through_this_interpreter(env, mlflow_uri) -> None:
    interpreter, *argv = _cli(env, "ui").split()
    assert Path(interpreter).resolve() == Path(sys.executable).resolve()  # the console script's python
    assert argv == ["-m", "mlflow", "ui", "--backend-store-uri", mlflow_uri, "--port", "5000", "--app-name", "upscale"]
    # mlflow missing from the interpreter: hidden from this process the way a failed import would leave it.
    hide_mlflow = "import sys; sys.modules['mlflow'] = None; from upscale.api.cli import main; main()"
    r = subprocess.run([sys.executable, "-c", hide_mlflow, "ui", "--launch"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == f"error: mlflow is not installed for {sys.executable}: pip install 'upscale[worker]'"


@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_grid_over_the_segment_limit(env, tmp_path: Path, command: str) -> None:
    """`upscale plan` and `upscale run` refuse, in one line and before planning, the grid POST /sweeps refuses:
    UPSCALE_MAX_SEGMENTS."""
    spec = tmp_path / "huge.json"
    spec.write_text(json.dumps({**SMALL_SPEC, "moe": {"experts": list(range(2, 1002)), "topk": [1, 2]},
                                "upcycling": {"methods": ["naive", "drop"], "r": [i / 1000 for i in range(1000)]}}))
    line = _fails({**env, "UPSCALE_MAX_SEGMENTS": "5000"}, command, str(spec))
    assert "UPSCALE_MAX_SEGMENTS" in line and "over the limit of 5,000" in line


def test_plan_of_a_corpus_missing_under_the_data_roots(env, tmp_path: Path) -> None:
    """A corpus under the data roots (UPSCALE_HOME/data) that is not there: one line at data.corpus, as POST /sweeps
    answers 422; a relative path that does not exist says so."""
    spec = tmp_path / "missing.json"
    spec.write_text(json.dumps({**SMALL_SPEC, "data": {"corpus": str(tmp_path / "data" / "texts")}}))
    line = _fails(env, "plan", str(spec))
    assert "data.corpus" in line and "does not exist under the data roots" in line
    spec.write_text(json.dumps({**SMALL_SPEC, "data": {"corpus": "texts/corpus.jsonl"}}))
    line = _fails(env, "plan", str(spec))
    assert "data.corpus" in line and "'texts/corpus.jsonl' does not exist (a relative path, from " in line
