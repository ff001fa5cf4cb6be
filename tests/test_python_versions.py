"""upscale under the newest Python the machine has (pyproject admits 3.11 to 3.13; CI runs 3.11).

A fresh virtual environment of the newest interpreter >= 3.12 found on PATH or under pyenv installs the package with
its base dependencies only (no worker extra: what a notebook that fits and plans installs) and plans the paper's joint
grid with `upscale plan --json`; the plan must be the one this interpreter computes, segment for segment (ids are
content hashes, so a difference in any field shows). With a state store in its home, which that install cannot read,
the plan is refused with what to install. Slow: it installs packages.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_packaging import copy_tracked
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "sweeps" / "examples" / "liew-joint.yaml"


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=30).stdout.split()
    except OSError:
        return None
    return (int(out[0]), int(out[1])) if len(out) == 2 else None


def newest_python() -> tuple[str, tuple[int, int]] | None:
    """The newest interpreter >= 3.12 on PATH (python3.N) or under pyenv (~/.pyenv/versions/3.N.*), or None."""
    found = [shutil.which(f"python3.{n}") for n in (13, 12)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found += [str(p) for p in pyenv.glob("3.1[23].*/bin/python3")]
    versions = [(p, v) for p in found if p and (v := _version(p)) and v >= (3, 12)]
    return max(versions, key=lambda pv: pv[1], default=None)


@pytest.mark.slow
def test_installs_and_plans_under_the_newest_python(tmp_path: Path) -> None:
    newest = newest_python()
    if newest is None:
        pytest.skip("no Python >= 3.12 on PATH or under ~/.pyenv/versions: install one (pyenv install 3.13) to run")
    python, version = newest
    assert version < (3, 14), f"{python} is {version}: widen requires-python in pyproject.toml first"
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    src = copy_tracked(tmp_path / "src")
    subprocess.run([*pip, str(src)], check=True, timeout=600, capture_output=True)
    # run from tmp_path: the checkout's upscale/ folder must not shadow the installed package
    env = {**os.environ, "UPSCALE_HOME": str(tmp_path / "home")}
    out = subprocess.run([str(venv / "bin" / "upscale"), "plan", str(SPEC), "--json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)
    ours = plan(load_spec(SPEC))
    assert [(s["id"], s["flops"]) for s in theirs["segment_list"]] == [(s.id, s.flops) for s in ours.segments]
    assert not (tmp_path / "home").exists()  # planning creates no store
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "upscale.db").touch()  # a store (SQLite) this install has no SQLAlchemy to read
    out = subprocess.run([str(venv / "bin" / "upscale"), "plan", str(SPEC)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "pip install 'upscale[worker]'" in out.stderr, out.stderr
