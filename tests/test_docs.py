"""Every document and source file cites only what the repository holds.

Strategy: read every tracked text file (`git ls-files`) and check four things.

* A relative path to a .md/.txt/.yaml/.yml/.csv/.py file (`docs/laws.md`, `upscale/storage.py`, `../README.md`)
  names a file that exists, resolved against the repository root or the citing file's folder. URLs are removed
  first; absolute paths and paths inside a longer token are not matched; a path is checked only when it starts
  with `./` or `../`, its first folder is `docs` or exists at the root or beside the citing file, so a path inside
  another project (`scripts/sparsify_ckpt_unsharded.py` of OLMoE) is not mistaken for ours.
* A markdown link to a section (`docs/architecture.md#measured-facts`) and a quoted section citation
  (`docs/laws.md, "D*"`) name a heading that exists in that file.
* The founding design files and paper texts that stayed outside the repository are not cited.
* No file cites an issue number: a reader of the code cannot see the tracker, so comments state the reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
NAMESPACE = "upscale"
OURS = {"docs"}  # folders that must exist, so a citation of one is checked even where the folder is missing

URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s)>\]`'\"]*")
# A relative path with at least one folder, not preceded by anything that would make it part of a longer token
# (a word character, a dot, a slash: `/abs/dir/x.py`, `pkg.mod/x.py`) and ending in a cited extension.
PATH = re.compile(r"(?<![\w./~$-])((?:\.{1,2}/)*[\w-][\w.-]*(?:/[\w.-]+)*/[\w.-]+\.(?:md|txt|ya?ml|csv|py))(?![\w/])")
MD_LINK_ANCHOR = re.compile(r"\]\(([^)#\s]+\.md)#([^)\s]+)\)")
# `docs/x.md, "Section"` or `docs/x.md "Section"`, possibly wrapped onto a comment line (`# "Section"`).
QUOTED_SECTION = re.compile(r"(docs/[\w-]+\.md),?\s+(?:#\s*)?\"([^\"]{1,80})\"")
# The founding files that were never part of the repository, and their folders.
OUTSIDE = re.compile(r"\b(?:DESIGN|LAWS|METHODS|STYLE)\.md\b|(?<![\w-])papers/|\.\./shared\b")
ISSUE = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)


@cache
def tracked_text_files() -> dict[str, str]:
    """path -> text of every tracked file that is UTF-8 text and present in the working tree, this one excepted
    (its examples name what the others must not)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to list the tracked files")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    out = {}
    for name in names.decode().split("\0"):
        path = ROOT / name
        if not name or name == SELF or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            out[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def headings(path: Path) -> frozenset[str]:
    return frozenset(m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+)$", path.read_text(), re.MULTILINE))


def cited_paths(name: str, text: str) -> list[str]:
    """The relative paths `name` cites that must exist here (see the module docstring), as written."""
    folder = (ROOT / name).parent
    out = []
    for match in PATH.finditer(URL.sub(" ", text)):
        path = match.group(1)
        first = path.split("/", 1)[0]
        if path.startswith(("./", "../")) or first in OURS or (ROOT / first).exists() or (folder / first).exists():
            out.append(path)
    return out


def resolves(name: str, path: str) -> Path | None:
    """The file `path` names, from the root or the citing file's folder; `upscale/<folder>/...` is also the
    installed name of the top-level `<folder>/...` (pyproject maps each folder into the namespace)."""
    installed = path.removeprefix(f"{NAMESPACE}/")
    for base, rel in ((ROOT, path), ((ROOT / name).parent, path), (ROOT, installed)):
        candidate = (base / rel).resolve()
        if candidate.is_file():
            return candidate
    return None


def test_every_cited_path_exists() -> None:
    missing = [f"{name}: {path}" for name, text in tracked_text_files().items() for path in cited_paths(name, text)
               if resolves(name, path) is None]
    assert not missing, "cited files that are not in the repository:\n  " + "\n  ".join(sorted(set(missing)))


def test_every_cited_section_exists() -> None:
    missing = []
    for name, text in tracked_text_files().items():
        for target, anchor in MD_LINK_ANCHOR.findall(URL.sub(" ", text)):
            doc = resolves(name, target)
            if doc is not None and anchor not in {slug(h) for h in headings(doc)}:
                missing.append(f"{name}: {target}#{anchor}")
        for target, section in QUOTED_SECTION.findall(text):
            doc = resolves(name, target)
            wanted = " ".join(section.replace("#", " ").split()).lower()
            if doc is not None and wanted not in {h.lower() for h in headings(doc)}:
                missing.append(f'{name}: {target} "{section}"')
    assert not missing, "cited sections that do not exist:\n  " + "\n  ".join(sorted(set(missing)))


def test_no_file_outside_the_repository_is_cited() -> None:
    hits = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for name, text in tracked_text_files().items() for m in OUTSIDE.finditer(text)]
    assert not hits, "references to files that are not in the repository:\n  " + "\n  ".join(hits)


def test_no_issue_numbers() -> None:
    hits = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for name, text in tracked_text_files().items() for m in ISSUE.finditer(text)]
    assert not hits, "issue numbers (state the reason instead):\n  " + "\n  ".join(hits)


@pytest.mark.parametrize(("text", "expected"), [
    ("see docs/laws.md and `fitting/laws.py`.", ["docs/laws.md", "fitting/laws.py"]),
    ("[deploy](../deploy/README.md#compose)", ["../deploy/README.md"]),
    ("https://github.zerozr99.workers.dev/org/repo/blob/main/docs/x.md and /work/shared/x.md", []),
    ("OLMoE's scripts/sparsify_ckpt_unsharded.py", []),  # another project's path: no such folder here
    ("sweeps/examples/*.yaml and fitting/data/synthetic-{dense,moe}.csv", []),  # patterns, not files
])
def test_path_matching(text: str, expected: list[str]) -> None:
    assert cited_paths("README.md", text) == expected
