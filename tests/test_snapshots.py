"""The contracts users and deployments build on, pinned: the OpenAPI document (clients generated from it), the CLI
command tree with every option (scripts that call it), and the Alembic head (stores migrated to it). A change to
any of them fails here until it is made deliberately: rerun with UPSCALE_UPDATE_SNAPSHOTS=1, read the diff of
tests/snapshots/ and commit it with the change that caused it (torchtitan's test_no_new_cli_options is the model)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "snapshots"
UPDATE = os.environ.get("UPSCALE_UPDATE_SNAPSHOTS") == "1"


def _check(name: str, current: Any) -> None:
    path = SNAPSHOTS / name
    text = json.dumps(current, indent=1, sort_keys=True) + "\n"
    if UPDATE:
        path.write_text(text)
    pinned = path.read_text() if path.exists() else "(none)"
    assert text == pinned, (f"{name} changed: if that is deliberate, rerun with UPSCALE_UPDATE_SNAPSHOTS=1 and commit "
                            f"tests/snapshots/{name} with the change")


def test_the_openapi_document_is_pinned(tmp_path) -> None:
    from upscale.api.app import create_app
    from upscale.orchestrator.settings import Settings

    _check("openapi.json", create_app(Settings(home=tmp_path), scheduler=False).openapi())


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _param(p: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": p.name, "kind": p.param_type_name, "required": p.required,
                           "type": _type_name(p.type_descriptor.annotation), "multiple": p.multiple}
    if p.param_type_name == "option":
        out |= {"opts": sorted(p.opts + p.secondary_opts), "flag": p.is_flag, "envvar": p.envvar}
    default = p.default if not callable(p.default) else "(computed)"
    if isinstance(default, Path):  # a file of the checkout: where the checkout is does not matter
        default = f"<repo>/{default.resolve().relative_to(ROOT).as_posix()}"
    out["default"] = default if isinstance(default, str | int | float | bool | type(None)) else repr(default)
    return out


def _tree(command: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"params": [_param(p) for p in command.params]}
    panel = getattr(command, "rich_help_panel", None)
    if panel:
        node["panel"] = panel
    if hasattr(command, "commands"):  # a group: its commands in the order `upscale --help` lists them
        node["commands"] = [{"name": name, **_tree(command.commands[name])} for name in command.commands]
    return node


def test_the_cli_command_tree_is_pinned() -> None:
    from upscale.api.cli import app

    _check("cli.json", _tree(typer.main.get_command(app)))


def test_the_alembic_head_is_pinned() -> None:
    from importlib.resources import files

    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(files("upscale.orchestrator") / "migrations"))
    _check("alembic_head.json", sorted(ScriptDirectory.from_config(cfg).get_heads()))
