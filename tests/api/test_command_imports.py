"""A command loads only what it uses: `upscale fit` runs without the sweep language, the store, the scheduler or the
server, and `upscale --version` without any command module (api/cli/app.py, `LazyCommands`).

Each case runs the console script's `main` in a fresh interpreter and reads `sys.modules` at exit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
POINTS = ROOT / "tests" / "data" / "chinchilla-points.csv"
# The sweep language, the control layer, the store and scheduler, the server and the heavy machinery. The
# orchestrator's `verbosity` (logging levels in the environment, no state) is what the root callback sets for every
# command, so it (and its package's empty `__init__`) is the one module of the orchestrator allowed.
FORBIDDEN = ("upscale.sweeps", "upscale.control", "upscale.orchestrator", "upscale.api.app", "upscale.api.routes",
             "fastapi", "ray", "mlflow", "sqlalchemy", "torch")
ALLOWED = {"upscale.orchestrator", "upscale.orchestrator.verbosity"}

RUN = """import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))
sys.argv = ["upscale", *sys.argv[1:]]
from upscale.api.cli import main
main()
"""


def loaded(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    done = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=120)
    return done, set(json.loads(done.stderr.strip().splitlines()[-1]))


def forbidden(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m not in ALLOWED and any(m == f or m.startswith(f + ".") for f in FORBIDDEN))


def test_fit_loads_no_sweep_store_or_server_module() -> None:
    done, modules = loaded("fit", "--law", "chinchilla", "--data", str(POINTS), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["law"] == "chinchilla"
    assert "upscale.fitting.fit" in modules and "upscale.api.cli.fit_commands" in modules  # it did fit
    assert forbidden(modules) == []


def test_version_loads_no_command_module() -> None:
    done, modules = loaded("--version")
    assert done.returncode == 0 and done.stdout.startswith("upscale ")
    assert sorted(m for m in modules if m.startswith("upscale.api.cli.") and m != "upscale.api.cli.app") == []
    assert forbidden(modules) == []


def test_a_user_error_of_a_package_is_one_line_without_its_module_registered() -> None:
    """A SpecError from `upscale plan` is one `error:` line: the packages' errors are looked up once caught, so no
    command module need import them up front."""
    done, _ = loaded("plan", str(ROOT / "tests" / "data" / "chinchilla-points.csv"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr
