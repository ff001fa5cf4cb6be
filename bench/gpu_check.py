"""The one-call device check: everything upscale claims about GPUs, run on a lent GPU machine in one command.

Three modes (docs/gpu.md says when to use each):

* `prep` (where PyPI is reachable; run with the project's venv, which has torch for DeepSpeed's build): a folder of
  wheels, `.whl/` by default, of what upscale needs on the GPU machine beyond its image (bench/gpu_image_packages.txt):
  the pyproject dependencies and worker extra, resolved for CPython 3.12 on manylinux x86-64, minus torch and what
  the image holds. DeepSpeed is built from its sdist as a pure-Python wheel, MLflow comes as `mlflow-skinny` (all a
  worker uses), Ray without its `default` extra (the dashboard is off) and slimmed (`slim_ray_wheel`). It
  fails unless the folder and the tracked tree together fit in the 64 MiB one call carries.
* `run` (on the GPU machine, no network): installs that folder and this tree into a private target directory, then
  runs each step below under its own time limit, in a fresh process, and writes one JSON file per step and a
  summary to `--out` (`$OUT` there). A step that fails or times out is recorded as such and the next one runs.
* `dry-run` (any CPU machine, nothing installed): the same steps at tiny sizes on the CPU, so the script itself is
  tested here (tests/test_gpu_check.py).

Steps: env (torch, CUDA, GPU, memory, what pip sees), dispatch (bench/dispatch_check.py: grouped dispatch against an
fp64 loop and against DeepSpeed's), pytest (the tests marked `gpu`), throughput (bench/train_throughput.py --gpu:
0.1B dense and 8x2, worker against a plain loop, MFU against 989 TFLOP/s), sweep (a small real sweep through
`upscale run` on embedded Ray with the GPU as a resource, Ray's GPU count checked against torch's) and moe_dispatch
(bench/moe_dispatch.py on CUDA in bf16 at 0.1B).

    .venv/bin/python bench/gpu_check.py prep                  # here: builds .whl/
    bash bench/gpu_check.sh run                               # there, with .whl carried (docs/gpu.md)
    .venv/bin/python bench/gpu_check.py dry-run --out /tmp/gc  # here, on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
CARRY_LIMIT = 64 * 2**20  # what one device call carries: the tree plus the carried wheel folder
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                   "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64", "any")
# the image's own: never carried (a CUDA torch and its libraries are what the machine is for)
IMAGE_OWN = re.compile(r"^(torch|triton|nvidia-.*)$")
# pinned by pyproject where the image's version may differ and the wheel is small: carried even if the image has one
ALWAYS_CARRY = {"typer"}
STEP_NAMES = ("env", "dispatch", "pytest", "throughput", "sweep", "moe_dispatch")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------- prep

def device_requirements() -> list[str]:
    """pyproject's dependencies and worker extra, as the GPU machine needs them (torch: the image's)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = []
    for req in [*project["dependencies"], *project["optional-dependencies"]["worker"]]:
        name = norm(re.match(r"[A-Za-z0-9_.-]+", req).group(0))
        if name in ("torch", "psycopg"):  # the image's torch; PostgreSQL is a deployment's, not the check's
            continue
        if name == "mlflow":
            req = req.replace("mlflow", "mlflow-skinny", 1)
        if name == "ray":
            req = re.sub(r"\[[^]]*\]", "[train]", req)
        out.append(req)
    return out


def pip(*args: str, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], check=True, **kw)


def platform_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]
    for p in WHEEL_PLATFORMS:
        args += ["--platform", p]
    return args


# Parts of Ray's wheel the check never loads: Java workers (31 MiB), the dashboard's web client (the dashboard is
# off), RLlib, Serve and the LLM libraries. Ray Core, Train, Tune and Data stay.
RAY_UNUSED = ("ray/jars/", "ray/dashboard/client/", "ray/rllib/", "ray/serve/", "ray/llm/")


def slim_ray_wheel(wheel: Path) -> None:
    """Rewrite Ray's wheel without RAY_UNUSED (and their RECORD lines), its members over 1 MiB (the GCS server, the
    raylet, _raylet.so: 32 MiB deflated) LZMA-compressed, which pip's zipfile extracts like any other."""
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if item.filename.startswith(RAY_UNUSED):
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True)
                                if not line.startswith(tuple(p.encode() for p in RAY_UNUSED)))
            item.compress_type = zipfile.ZIP_LZMA if item.file_size > 2**20 else zipfile.ZIP_DEFLATED
            dst.writestr(item, data)
    tmp.replace(wheel)


def tree_bytes() -> int:
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return sum((ROOT / n).stat().st_size for n in tracked.decode().split("\0") if n and (ROOT / n).is_file())


def prep(dest: Path) -> dict:
    """Build the wheel folder `dest` and return its manifest (also written to dest/manifest.json)."""
    image = {norm(n) for n in (BENCH / "gpu_image_packages.txt").read_text().split() if not n.startswith("#")}
    reqs = device_requirements()
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(tmp) / "built"
        ds = next(r for r in reqs if norm(r).startswith("deepspeed"))
        print(f"prep: building {ds} as a pure-Python wheel (DS_BUILD_OPS=0: ops JIT-build where used)", flush=True)
        pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(built), ds,
            env={**os.environ, "DS_BUILD_OPS": "0"})
        print("prep: resolving for CPython 3.12 manylinux x86-64 (a few minutes)", flush=True)
        report = Path(tmp) / "report.json"
        pip("install", "--dry-run", "--ignore-installed", "-q", "--report", str(report), "--target",
            str(Path(tmp) / "t"), "--find-links", str(built), *platform_args(), *reqs)
        resolved = {norm(i["metadata"]["name"]): i["metadata"]["version"]
                    for i in json.loads(report.read_text())["install"]}
        carry = {n: v for n, v in resolved.items()
                 if not IMAGE_OWN.match(n) and (n not in image or n in ALWAYS_CARRY)}
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for wheel in built.glob("*.whl"):
            shutil.copy2(wheel, dest)
        others = [f"{n}=={v}" for n, v in sorted(carry.items()) if n != "deepspeed"]
        print(f"prep: downloading {len(others)} wheels", flush=True)
        pip("download", "--no-deps", "-q", "-d", str(dest), *platform_args(), *others)
    for wheel in dest.glob("ray-*.whl"):
        slim_ray_wheel(wheel)
    wheels = {w.name: w.stat().st_size for w in sorted(dest.glob("*.whl"))}
    tree = tree_bytes()
    manifest = {"wheels": wheels, "wheel_bytes": sum(wheels.values()), "tree_bytes": tree,
                "carried_bytes": sum(wheels.values()) + tree, "limit_bytes": CARRY_LIMIT,
                "left_to_the_image": sorted(n for n in resolved if n not in carry)}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2))
    mib = manifest["carried_bytes"] / 2**20
    print(f"prep: {len(wheels)} wheels, {manifest['wheel_bytes'] / 2**20:.1f} MiB, with the tree {mib:.1f} MiB of "
          f"{CARRY_LIMIT / 2**20:.0f} MiB")
    if manifest["carried_bytes"] > CARRY_LIMIT:
        biggest = sorted(wheels.items(), key=lambda kv: -kv[1])[:5]
        raise SystemExit(f"error: {mib:.1f} MiB would not travel in one call ({CARRY_LIMIT / 2**20:.0f} MiB); the "
                         f"largest wheels: {biggest}. Add names the image already has to bench/gpu_image_packages.txt "
                         "or drop an extra from device_requirements()")
    return manifest


# ---------------------------------------------------------------- run / dry-run

@dataclass(frozen=True)
class Step:
    name: str
    budget_s: int          # on the GPU machine; the dry run has its own (`dry_budget_s`)
    dry_budget_s: int
    gpu_args: tuple[str, ...]
    dry_args: tuple[str, ...]


def steps(scratch: Path) -> list[Step]:
    """The steps in order; `{json}` in an argument is the file the step writes its figures to."""
    py = (sys.executable,)
    me = (*py, str(Path(__file__).resolve()))
    gpu_tests = tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                             if "mark.gpu" in p.read_text()))
    pytest = (*py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
              f"--junitxml={scratch / 'junit.xml'}", *gpu_tests)
    return [
        Step("env", 30, 60, (*me, "_env", "{json}", "cuda"), (*me, "_env", "{json}", "cpu")),
        Step("dispatch", 60, 120,
             (*py, str(BENCH / "dispatch_check.py"), "--device", "cuda", "--size", "0.1B", "--batch", "4",
              "--context", "512", "--json", "{json}"),
             (*py, str(BENCH / "dispatch_check.py"), "--json", "{json}")),
        Step("pytest", 60, 120, pytest, pytest),
        Step("throughput", 120, 300,
             (*py, str(BENCH / "train_throughput.py"), "--gpu", "--repeats", "2", "--steps", "20", "--json",
              "{json}"),
             (*py, str(BENCH / "train_throughput.py"), "--repeats", "1", "--steps", "6", "--json", "{json}")),
        Step("sweep", 150, 480, (*me, "_sweep", "{json}", "1"), (*me, "_sweep", "{json}", "0")),
        Step("moe_dispatch", 80, 180,
             (*py, str(BENCH / "moe_dispatch.py"), "--device", "cuda", "--dtype", "bf16", "--sizes", "0.1B",
              "--batch", "8", "--context", "1024", "--steps", "6", "--repeats", "2", "--json", "{json}"),
             (*py, str(BENCH / "moe_dispatch.py"), "--sizes", "nano", "--batch", "2", "--context", "32", "--steps",
              "3", "--repeats", "1", "--json", "{json}")),
    ]


def run_step(step: Step, dry: bool, out: Path, scratch: Path, env: dict[str, str]) -> dict:
    """Run one step in its own process group under its time limit; write out/<name>.json and return its record."""
    raw = scratch / f"{step.name}.raw.json"
    raw.unlink(missing_ok=True)
    argv = [a.replace("{json}", str(raw)) for a in (step.dry_args if dry else step.gpu_args)]
    budget = step.dry_budget_s if dry else step.budget_s
    # pytest runs in the tree (its markers are in pyproject); everything else away from it, so that the checkout's
    # upscale/ folder never shadows the installed package (nor reaches Ray's workers as the driver's directory)
    cwd = ROOT if step.name == "pytest" else scratch
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=budget)
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        status = "timeout"
    figures = json.loads(raw.read_text()) if raw.exists() else None
    if step.name == "pytest":
        figures = junit_counts(scratch / "junit.xml")
        if status == "failed" and figures and not figures["failed"] and not figures["errors"] and proc.returncode == 5:
            status = "ok"  # exit 5: every test deselected; the counts say so
    record = {"step": step.name, "status": status, "seconds": round(time.monotonic() - t0, 1), "budget_s": budget,
              "returncode": proc.returncode, "command": argv, "figures": figures,
              "log_tail": log.decode(errors="replace")[-4000:]}
    (out / f"{step.name}.json").write_text(json.dumps(record, indent=2))
    print(f"gpu_check: {step.name:12s} {status:7s} {record['seconds']:6.1f} s (limit {budget} s)", flush=True)
    return record


def junit_counts(path: Path) -> dict | None:
    if not path.exists():
        return None
    suite = ElementTree.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    cases = [{"name": f"{c.get('classname')}.{c.get('name')}", "outcome": next(
        (child.tag for child in c if child.tag in ("failure", "error", "skipped")), "passed")}
        for c in suite.iter("testcase")]
    return {"tests": counts["tests"], "passed": counts["tests"] - counts["failures"] - counts["errors"]
            - counts["skipped"], "failed": counts["failures"], "errors": counts["errors"],
            "skipped": counts["skipped"], "cases": cases}


def install(wheels: Path, site: Path, env: dict[str, str]) -> dict:
    """The carried wheels and this tree into `site` (offline, no dependency resolution: the folder is complete)."""
    t0 = time.monotonic()
    common = ["-q", "--no-index", "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--target", str(site)]
    found = sorted(str(w) for w in wheels.glob("*.whl"))
    if not found:
        raise SystemExit(f"error: no wheels in {wheels}: run `bench/gpu_check.py prep` where PyPI is reachable and "
                         "carry the folder (docs/gpu.md)")
    for what in (["--no-compile", "--upgrade", *found], ["--no-build-isolation", str(ROOT)]):
        subprocess.run([sys.executable, "-m", "pip", "install", *common, *what], check=True, env=env, timeout=300)
    return {"wheels": len(found), "seconds": round(time.monotonic() - t0, 1)}


def check(mode: str, out: Path, wheels: Path, only: list[str] | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    dry = mode == "dry-run"
    scratch = Path(tempfile.mkdtemp(prefix="upscale-gpu-check-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1", "UPSCALE_HOME": str(scratch / "home")}
    summary: dict = {"mode": mode, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    t0 = time.monotonic()
    if not dry:
        site = scratch / "site"
        env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
        summary["install"] = install(wheels, site, env)
    records = [run_step(s, dry, out, scratch, env) for s in steps(scratch) if not only or s.name in only]
    summary |= {"seconds": round(time.monotonic() - t0, 1),
                "steps": {r["step"]: {"status": r["status"], "seconds": r["seconds"]} for r in records},
                "ok": all(r["status"] == "ok" for r in records)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"gpu_check: {'all steps ok' if summary['ok'] else 'SOME STEPS FAILED'} in {summary['seconds']:.0f} s; "
          f"JSON in {out}")
    return 0 if summary["ok"] else 1


# ---------------------------------------------------------------- steps that are not a script of their own

def env_report(path: Path, device: str) -> None:
    """torch, CUDA and the GPU; the versions upscale's machinery runs with; what `pip check` says of them."""
    import importlib.metadata as md
    import platform

    import torch

    report = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "cuda_available": torch.cuda.is_available(), "gpus": torch.cuda.device_count(),
              "grouped_mm": hasattr(torch, "_grouped_mm"), "cpus": os.cpu_count()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        report |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                   "capability": f"{props.major}.{props.minor}", "multiprocessors": props.multi_processor_count,
                   "bf16": torch.cuda.is_bf16_supported()}
    versions = {}
    for name in ("upscale", "deepspeed", "ray", "mlflow-skinny", "mlflow", "sqlalchemy", "pydantic", "typer",
                 "transformers", "tokenizers", "numpy"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    report["versions"] = versions
    checked = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    report["pip_check"] = checked.stdout.strip().splitlines()[:40]
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device visible to torch")


SWEEP_SPEC = """# The device check's sweep: one tiny size, a 4x2 MoE, one upcycled and one scratch budget.
name: gpu-check
model: {sizes: [nano]}
moe: {experts: [4], topk: [2]}
upcycling: {methods: [naive]}
tokens: {d1: [4.096e4], d2: [4.096e4], scratch: [4.096e4]}
train: {context: 64, batch_size: 16, lr: {dense: 3.0e-3, moe: 2.0e-3}, warmup_tokens: 4096, seed: 0}
data: {corpus: "builtin:python-stdlib", tokenizer: bytes, eval_tokens: 4096}
resources: {cpus: 1, gpus: GPUS, workers: 1}
"""


def sweep(path: Path, gpus: int) -> None:
    """Embedded Ray as `upscale run` starts it; its GPU count against torch's; then `upscale run --json` in this
    process (it finds Ray started) on a tiny sweep whose segments each ask Ray for `gpus` GPUs."""
    import contextlib
    import io

    import ray
    import torch

    from upscale.api.cli import app
    from upscale.orchestrator.scheduler import ensure_ray
    from upscale.orchestrator.settings import Settings

    spec = path.parent / "gpu-check.yaml"
    spec.write_text(SWEEP_SPEC.replace("GPUS", str(gpus)))
    t0 = time.monotonic()
    ensure_ray(Settings())
    report = {"ray_start_s": round(time.monotonic() - t0, 1), "ray_gpus": ray.cluster_resources().get("GPU", 0),
              "torch_gpus": torch.cuda.device_count(), "segment_gpus": gpus}
    report["gpu_counts_agree"] = report["ray_gpus"] == report["torch_gpus"]
    printed = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(printed):
        app(["run", str(spec), "--json"], standalone_mode=False)
    result = json.loads(printed.getvalue())
    report |= {"run_s": round(time.monotonic() - t0, 1), "sweep_id": result["sweep_id"],
               "observations": len(result["observations"]), "trained": result["trained"],
               "losses": [o.get("loss") for o in result["observations"]]}
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    if not report["gpu_counts_agree"]:
        print(f"error: Ray sees {report['ray_gpus']} GPUs, torch {report['torch_gpus']}", file=sys.stderr)
    # The figures are written: leave now. The interpreter's exit handlers (Ray's shutdown, MLflow's flush) took
    # minutes on a loaded 2-core machine and are no part of the check.
    sys.stdout.flush()
    os._exit(0 if report["gpu_counts_agree"] else 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode")  # none: dry-run (what `make bench` runs)
    p = sub.add_parser("prep", help="build the wheel folder (needs PyPI)")
    p.add_argument("--dest", type=Path, default=ROOT / ".whl")
    for mode in ("run", "dry-run"):
        p = sub.add_parser(mode, help="the checks on the GPU" if mode == "run" else "the checks on the CPU, tiny")
        p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
        p.add_argument("--wheels", type=Path, default=ROOT / ".whl")
        p.add_argument("--only", nargs="+", choices=STEP_NAMES, help="run these steps only")
    for inner in ("_env", "_sweep"):  # the steps that are functions of this file, each in its own process
        p = sub.add_parser(inner)
        p.add_argument("json", type=Path)
        p.add_argument("arg")
    args = ap.parse_args()
    if args.mode is None:
        args = ap.parse_args(["dry-run"])
    if args.mode == "prep":
        prep(args.dest)
    elif args.mode == "_env":
        env_report(args.json, args.arg)
    elif args.mode == "_sweep":
        sweep(args.json, int(args.arg))
    else:
        sys.exit(check(args.mode, args.out, args.wheels, args.only))


if __name__ == "__main__":
    main()
