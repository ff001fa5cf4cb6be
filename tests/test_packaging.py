"""The installed distribution is one namespace, `upscale`, whatever folder each package lives in.

Strategy: build the real wheel from this tree (setuptools, no network, no build isolation) and read its file list;
check pyproject's package list against the folders on disk; and check that no source file imports a package by its
folder name (``import fitting``), which would only work from a checkout and load a second copy of the module.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIR: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
FOLDERS = [f for f in PACKAGE_DIR.values() if f != "upscale"]


def copy_tracked(src: Path) -> Path:
    """A copy of the tracked files at `src`, to build from: setuptools writes build/ and *.egg-info beside the
    sources, which must not land in the checkout."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    return src


def test_the_wheel_installs_one_top_level_name(tmp_path: Path) -> None:
    src = copy_tracked(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("upscale-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"upscale"}, top
    for folder in FOLDERS:  # each mapped folder arrives whole, its data files included
        assert f"upscale/{folder}/__init__.py" in names
    assert "upscale/sweeps/examples/demo.yaml" in names
    assert "upscale/orchestrator/migrations/alembic.ini" in names
    assert any(n.startswith("upscale/fitting/data/synthetic-") for n in names)


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    on_disk = {"upscale"}
    for name, folder in PACKAGE_DIR.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            on_disk.add(".".join([name, *rel.parts]))
    assert listed == on_disk


def test_no_source_imports_a_folder_name() -> None:
    # at a line's start, or where a string's code starts (a subprocess's `-c` program, after a quote or a \n)
    bare = re.compile(rf"(?:^|\\n|[\"'])\s*(from|import)\s+({'|'.join(FOLDERS)})(\.|\s)", re.M)
    offenders = [str(p.relative_to(ROOT)) for d in [*FOLDERS, "upscale", "tests", "bench"]
                 for p in (ROOT / d).rglob("*.py") if bare.search(p.read_text())]
    assert offenders == []


def test_import_upscale_is_light() -> None:
    """A notebook's `import upscale` (and the CLI's start) must not pull torch, ray or mlflow."""
    code = "import sys, upscale; print(sorted(m for m in ('torch', 'ray', 'mlflow', 'deepspeed') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"


def test_the_cli_starts_without_the_store_or_the_server() -> None:
    """The CLI's start (every `upscale` command, `--help` included) loads no SQLAlchemy, Alembic or FastAPI: the
    commands that read the store or serve import them when they run (orchestrator/clock.py is why the request
    schemas need no SQLAlchemy)."""
    heavy = ('torch', 'ray', 'mlflow', 'deepspeed', 'sqlalchemy', 'alembic', 'fastapi')
    code = f"import sys, upscale.api.cli; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"
