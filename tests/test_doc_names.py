"""Every code name README.md and docs/*.md write in backticks exists, so a rename that leaves a doc behind fails.

A backticked span (one token, no spaces) is checked when it has one of these forms; the names are found by
reading our source files (ast), nothing is imported:

* a dotted name that starts with one of our packages, with or without the `upscale.` prefix
  (`sweeps.reuse.other_cuts`, `upscale.client.ApiError`, `upscale.Client`): the longest prefix that is a module
  must be one, and the next name must be defined at its top level (def, class, assignment, import, `__all__`);
  one more name after a class must be defined in the class's body;
* `module.name` where `module` is the file name of one of our modules (`reuse.other_cuts`, `sizes.training_memory`):
  some module of that name defines `name`. A spec section (`data.corpus`, `moe.experts`: the fields of
  `SweepSpec`) is a field path, not a module;
* a call, `name()` or `name(...)`: a function or class of that name is defined somewhere in our source;
* a CamelCase name (`SpecError`, `SweepSpec`): a class or name defined in our source, or Python's builtins;
* a file name `x.py`: a file of that name is in the repository; `NNNN` or `NNNN_name`: an Alembic migration.

Not code names, so not checked: a dotted name ending in a data file's extension (`meta.json`, `scratch.csv`); an
MLflow tag, `upscale.` followed by what our code writes as a string (`PREFIX + "role"`); a record's field path,
`module.name` where our code writes `name` as a string (`report.loo_sampled`, `analysis.id`). Names of other
projects (torch, Ray, Hugging Face, DeepSpeed) start with `OTHER_PROJECTS` or are in `NOT_OURS`.
"""

from __future__ import annotations

import ast
import builtins
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("api", "control", "fitting", "orchestrator", "sweeps", "workers")  # folders mapped to upscale.<folder>
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MIGRATIONS = ROOT / "orchestrator" / "migrations" / "versions"

# Names of other projects the docs name, whose first part is not a package of theirs we could check.
NOT_OURS = {"AutoModelForCausalLM", "AutoTokenizer", "LlamaConfig", "LlamaForCausalLM", "MixtralForCausalLM",
            "GroupedMOELayer", "MoE", "GetTimeoutError", "LocalRayletDiedError", "NodeDiedError", "RaySystemError",
            "OperationalError", "Qwen2MoeForCausalLM", "upcycling_utils.py"}  # the last: Megatron-LM's file
OTHER_PROJECTS = ("torch.", "ray.", "deepspeed.", "datasets.", "numpy.", "scipy.", "nn.", "mlflow.", "engine.",
                  *(f"{name}." for name in NOT_OURS))
DATA_FILES = {"json", "csv", "pt", "db", "toml", "safetensors", "yaml", "yml", "md", "txt", "png", "ini"}

SPAN = re.compile(r"`([^`\s]+)`")
DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?$")
CALL = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)\(.*\)$")
CAMEL = re.compile(r"^[A-Z][a-z0-9]+[A-Z]\w*$|^[A-Z]\w*Error$")
MIGRATION = re.compile(r"^(\d{4})(_\w+)?$")
PY_FILE = re.compile(r"^[\w-]+\.py$")


def module_file(module: str) -> Path | None:
    """The source file of `upscale.a.b`, or None when it is not one of ours."""
    parts = module.split(".")
    if parts[0] != "upscale":
        return None
    folder = ROOT / ("upscale" if len(parts) == 1 or parts[1] not in PACKAGES else parts[1])
    rest = parts[1:] if folder.name == "upscale" else parts[2:]
    path = folder.joinpath(*rest)
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


@cache
def our_files() -> tuple[Path, ...]:
    return tuple(p for d in ("upscale", *PACKAGES) for p in (ROOT / d).rglob("*.py"))


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def defined(body: list[ast.stmt]) -> set[str]:
    """The names a module's or class's body defines."""
    out: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                out |= {e.value for e in ast.walk(node.value)
                        if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, optional imports
            out |= defined(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []))
    return out


def class_body(path: Path, name: str) -> list[ast.stmt] | None:
    return next((n.body for n in tree(path).body if isinstance(n, ast.ClassDef) and n.name == name), None)


@cache
def everywhere() -> frozenset[str]:
    """Every function, class and module-level name of our source."""
    names: set[str] = set()
    for path in our_files():
        names |= {n.name for n in ast.walk(tree(path))
                  if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        names |= defined(tree(path).body)
    return frozenset(names)


@cache
def strings() -> frozenset[str]:
    """Every short string our source writes: tag names, record keys."""
    return frozenset(n.value for path in our_files() for n in ast.walk(tree(path))
                     if isinstance(n, ast.Constant) and isinstance(n.value, str) and len(n.value) < 80)


@cache
def spec_sections() -> frozenset[str]:
    body = class_body(ROOT / "sweeps" / "spec.py", "SweepSpec") or []
    return frozenset(n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))


def resolves(module: str, names: list[str]) -> bool:
    """`module.names[0](.names[1])` is defined (see the module docstring)."""
    path = module_file(module)
    if path is None:
        return False
    if not names:
        return True
    if module_file(f"{module}.{names[0]}") is not None:
        return resolves(f"{module}.{names[0]}", names[1:])
    if names[0] not in defined(tree(path).body):
        return False
    if len(names) == 1:
        return True
    body = class_body(path, names[0])
    return body is None or names[1] in defined(body)


def dotted_exists(name: str) -> bool | None:
    """True/False for a dotted name of ours, None when the name is not one this test checks."""
    parts = name.split(".")
    if parts[-1] in DATA_FILES or name.startswith(OTHER_PROJECTS):
        return None
    if parts[0] == "upscale" and ".".join(parts[1:]) in strings():
        return None
    if parts[0] in PACKAGES:
        parts = ["upscale", *parts]
    if parts[0] == "upscale":
        return resolves("upscale", parts[1:])
    if parts[0] in spec_sections() or parts[-1] in strings():
        return None
    stems = [p for p in our_files() if p.stem == parts[0]]
    if not stems:
        return None
    return any(parts[1] in defined(tree(p).body) for p in stems)


def problem(span: str) -> str | None:
    """Why `span` names nothing that exists, or None."""
    if m := MIGRATION.match(span):
        found = sorted(p.stem for p in MIGRATIONS.glob(f"{m.group(1)}_*.py"))
        ok = found and (m.group(2) is None or span in found)
        return None if ok else f"no migration {span} (there are: {', '.join(found) or 'none'})"
    if PY_FILE.match(span):
        folders = ("upscale", *PACKAGES, "tests", "bench", "tools")
        ok = span in NOT_OURS or any(next((ROOT / d).rglob(span), None) for d in folders)
        return None if ok else f"no file {span} in the repository"
    if m := DOTTED.match(span):
        return None if dotted_exists(m.group(1)) is not False else f"{span} is not defined where it says"
    if m := CALL.match(span):
        name = m.group(1)
        ok = name in everywhere() or hasattr(builtins, name) or span.startswith(OTHER_PROJECTS)
        return None if ok else f"{span}: no function or class {name} in our source"
    if CAMEL.match(span):
        ok = span in everywhere() or hasattr(builtins, span) or span in NOT_OURS
        return None if ok else f"{span}: no class of that name in our source"
    return None


def named(path: Path) -> list[tuple[int, str]]:
    """(line, span) of each backticked single token in ``path``, fenced code blocks included."""
    return [(i, m.group(1)) for i, line in enumerate(path.read_text().splitlines(), 1) for m in SPAN.finditer(line)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_name_in_backticks_exists(doc: Path) -> None:
    missing = [f"{doc.relative_to(ROOT)}:{line}: {why}" for line, span in named(doc) if (why := problem(span))]
    assert not missing, "\n".join(missing)


def test_the_rules_catch_a_wrong_name() -> None:
    """The checker itself: a real name of each form passes, a renamed one fails."""
    assert problem("sweeps.reuse.other_cuts") is None and problem("sweeps.reuse.other_keys")
    assert problem("reuse.other_cuts") is None and problem("reuse.other_keys")
    assert problem("upscale.client.ApiError") is None and problem("upscale.client.ApiErr")
    assert problem("SpecError") is None and problem("SpecErrors")
    assert problem("0013_analysis_runner") is None and problem("0012_analysis_runner") and problem("9999")
    assert problem("model_dirs.py") is None and problem("model_dir.py")
    assert problem("build_model(cfg)") is None and problem("build_models(cfg)")
    assert problem("data.corpus") is None  # a spec field, not the module workers/data.py
