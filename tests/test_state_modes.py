"""The state upscale writes is its user's only: the SQLite store is created 0600 (its -wal and -shm files take that
mode) in folders made 0700, whatever the process umask; and the CLI makes every file it and its children create
0600 (tokens' hashes, specs, results, MLflow's store)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from upscale.orchestrator.store import Store


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_store_is_created_private_whatever_the_umask(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        Store(f"sqlite:///{tmp_path / 'home' / 'upscale.db'}")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "home") == 0o700
    files = sorted((tmp_path / "home").iterdir())
    assert tmp_path / "home" / "upscale.db" in files
    assert {f.name: _mode(f) for f in files} == {f.name: 0o600 for f in files}


@pytest.mark.slow  # a CLI process creating and migrating a store: ~30 s on a busy 2-core machine
def test_the_cli_writes_private_state(tmp_path) -> None:
    home = tmp_path / "state"
    upscale = Path(sys.executable).parent / "upscale"
    run = subprocess.run([str(upscale), "token", "create", "--scope", "read", "carol"], capture_output=True, text=True,
                         env={**os.environ, "UPSCALE_HOME": str(home)}, timeout=120)
    assert run.returncode == 0, run.stderr
    made = [home, *home.rglob("*")]
    assert made[1:], made
    assert {str(p): _mode(p) for p in made} == {str(p): 0o700 if p.is_dir() else 0o600 for p in made}
