"""Reading a sweep spec document: a .yaml/.yml/.json file or YAML/JSON text, as plain data, then `parse_spec`.

A spec may come from anyone who can reach the API, so reading one is bounded: `parse_document` refuses YAML aliases
(an 887-byte "billion laughs" expands to gigabytes), nesting deeper than MAX_DEPTH and integers beyond the store's
64-bit columns, each with its field path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml

from upscale.sweeps.errors import SpecError, SpecProblem, raise_if
from upscale.sweeps.spec import SweepSpec, excerpt, join_path, parse_spec

MAX_DEPTH = 64  # nesting of a spec document; a real spec nests 5 deep
MAX_INT = 2**63 - 1  # the store's integer columns are 64-bit


DEMO_SPEC = Path(__file__).resolve().parent / "examples" / "demo.yaml"


def load_spec(source: str | Path, max_segments: int | None = None) -> SweepSpec:
    """Read a spec from a .yaml/.yml/.json path or from YAML/JSON text (JSON is YAML); ``max_segments`` as for
    `parse_spec`."""
    text = source
    looks_like_path = isinstance(source, Path) or ("\n" not in source and (
        source.endswith((".yaml", ".yml", ".json")) or Path(source).is_file()))
    if looks_like_path:
        path = Path(source)
        if not path.is_file():
            raise SpecError([("", f"{path} is a folder, not a spec file" if path.is_dir()
                                  else f"no such spec file: {path}")])
        text = path.read_text()
    return parse_spec(parse_document(text, "json" if text.lstrip().startswith("{") else "yaml"), max_segments)


class SpecLoader(yaml.SafeLoader):
    """YAML's safe loader without aliases: `*name` repeats a node, so a few hundred bytes of nested aliases expand
    to gigabytes once loaded ("billion laughs"). A spec never needs one."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise SpecError([("", f"YAML aliases are not allowed in a spec (line {mark.line + 1}); write the "
                                  "value out")])
        return super().compose_node(parent, index)


def parse_document(text: str | bytes, fmt: Literal["json", "yaml"]) -> dict[str, Any]:
    """A spec document as plain data, read with bounds: YAML without aliases, at most MAX_DEPTH deep, no integer
    beyond MAX_INT; SpecError otherwise. JSON's `Infinity` and `NaN` parse here and are refused by the models."""
    try:
        data = json.loads(text) if fmt == "json" else yaml.load(text, Loader=SpecLoader)  # a SafeLoader subclass
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecError([("", f"not valid {fmt.upper()}: {e}")]) from None
    except RecursionError:
        raise SpecError([("", f"the document nests deeper than {MAX_DEPTH} levels")]) from None
    if not isinstance(data, dict):
        raise SpecError([("", "a sweep spec is a mapping with keys name, model, moe, upcycling, tokens, train")])
    check_document(data)
    return data


def check_document(data: Any, path: str = "") -> None:
    """SpecError for nesting beyond MAX_DEPTH, integers beyond MAX_INT or a NUL character in a string or key (no
    field holds one, and PostgreSQL cannot store one) in plain data (at ``path`` of a larger body), found
    iteratively: a recursive walk is what a deep document breaks. At most one problem of each kind."""
    problems: dict[str, SpecProblem] = {}
    stack: list[tuple[Any, str, int]] = [(data, path, 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            problems.setdefault("depth", (path, f"nested deeper than {MAX_DEPTH} levels"))
            continue
        if isinstance(node, bool):
            continue
        if isinstance(node, int) and abs(node) > MAX_INT:
            problems.setdefault("int", (path, f"integer {excerpt(node)} is beyond what the store holds "
                                              f"(at most {MAX_INT})"))
        elif isinstance(node, str) and "\x00" in node:
            problems.setdefault("nul", (path, "a NUL character (\\u0000) is not allowed in a spec"))
        elif isinstance(node, dict):
            if any("\x00" in str(k) for k in node):
                problems.setdefault("nul", (path, "a NUL character (\\u0000) is not allowed in a key"))
            stack += [(v, join_path(path, str(k)), depth + 1) for k, v in node.items()]
        elif isinstance(node, list):
            stack += [(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(node)]
    raise_if(list(problems.values()))
