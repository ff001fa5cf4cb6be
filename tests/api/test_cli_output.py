"""What the CLI prints when piped: tables and lines at their natural width (nothing cut at 80 columns with "…"), and
no third-party banners unless `-v`. Real subprocesses of the console script in a temporary UPSCALE_HOME."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from upscale.orchestrator import verbosity

UPSCALE = str(Path(sys.executable).parent / "upscale")
REPO = Path(__file__).resolve().parents[2]
DEEPSPEED_BANNER = "[real_accelerator.py"  # DeepSpeed's "Setting accelerator to CPU" line, printed on its import


def _run(home: Path, *args: str) -> str:
    env = {**os.environ, "UPSCALE_HOME": str(home), "COLUMNS": "80"}
    env.pop("UPSCALE_VERBOSE", None)
    r = subprocess.run([UPSCALE, *args], env=env, capture_output=True, text=True, timeout=300, cwd=home)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def test_piped_output_is_not_cut_at_80_columns(tmp_path) -> None:
    for args in (("laws",), ("plan", str(REPO / "sweeps/examples/liew-data-grid.yaml"))):
        out = _run(tmp_path, *args)
        assert max(len(line) for line in out.splitlines()) > 80, out
        assert "…" not in out, out


@pytest.mark.slow  # ~15 s on 2 cores: console-script runs
def test_wide_table_is_printed_whole_when_piped(tmp_path) -> None:
    out = _run(tmp_path, "demo", "--synthetic", "--bootstrap", "0", "--details", "--out", str(tmp_path / "plots"))
    star = [line for line in out.splitlines() if "closed form" in line or "┃ N1" in line]
    assert star and "…" not in out, out
    assert "Creating initial MLflow" not in out and "INFO" not in out, out


@pytest.mark.slow  # three console-script runs importing DeepSpeed: ~26 s on 2 cores
def test_banners_only_with_verbose(tmp_path) -> None:
    _run(tmp_path, "model", "init", "--size", "nano", "--vocab-size", "256", "--context", "32", "--out", "dense")
    upcycle = ("upcycle", "--dense", "dense", "--method", "naive", "--experts", "2", "--topk", "1", "--out")
    quiet = _run(tmp_path, *upcycle, "moe")
    assert DEEPSPEED_BANNER not in quiet and "naive" in quiet, quiet
    assert DEEPSPEED_BANNER in _run(tmp_path, "-v", *upcycle, "moe-v")


def test_configure_quiets_deepspeed_and_travels_in_the_environment(monkeypatch) -> None:
    for name in (verbosity.VERBOSE_ENV, *verbosity.QUIET_ENV):
        monkeypatch.delenv(name, raising=False)
    record = logging.LogRecord("DeepSpeed", logging.WARNING, __file__, 1, "banner", None, None)
    logger = logging.getLogger("DeepSpeed")
    try:
        verbosity.configure(False)
        assert not logger.filter(record) and not verbosity.is_verbose()
        assert os.environ["MLFLOW_LOGGING_LEVEL"] == "WARNING"  # what Ray's worker processes inherit
        assert verbosity.ray_logging_level() == logging.ERROR
        verbosity.configure(True)
        assert logger.filter(record) and verbosity.is_verbose()
        assert verbosity.ray_logging_level() == logging.INFO
    finally:
        logger.removeFilter(verbosity._DEEPSPEED_QUIET)
