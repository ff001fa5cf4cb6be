"""Check the import contracts of pyproject.toml's [tool.importlinter] (`make lint` runs this).

import-linter finds a package's modules on the filesystem, below the package's folder; our packages are top-level
folders that pyproject.toml's [tool.setuptools.package-dir] maps into `upscale`, so from a checkout it would find
`upscale` without `upscale.api` and the rest. This builds the installed layout as a view of symlinks in a
temporary folder (upscale/'s files and, beside them, one link per mapped folder) and runs the contracts on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    package_dir: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"]
    with tempfile.TemporaryDirectory(prefix="upscale-imports-") as tmp:
        view = Path(tmp) / "upscale"
        view.mkdir()
        for entry in (ROOT / package_dir["upscale"]).iterdir():
            (view / entry.name).symlink_to(entry)
        for name, folder in package_dir.items():
            if name != "upscale":
                (view / name.removeprefix("upscale.")).symlink_to(ROOT / folder)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")])}
        lint = Path(sys.executable).with_name("lint-imports")
        # From the view's folder: lint-imports puts its working directory first on the path, and the checkout's own
        # upscale/ would hide the view.
        return subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
                              cwd=tmp, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
