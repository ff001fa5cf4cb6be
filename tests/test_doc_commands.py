"""Every `upscale …` command line of README.md and docs/*.md names commands and options the CLI has, so a recipe
cannot drift from the CLI (a renamed option, a command that never took `--api`).

A command line is `upscale` followed by words, in a fenced code block (at a line's start or after `$(`, `|`, `&&`,
`;` or a path such as `.venv/bin/`) or in an inline code span that starts with it. It is split as the shell splits
it (quotes, `#` comments) and ends at a shell operator. Walking the typer tree (`typer.main.get_command(app)`): each
word that is not an option picks a subcommand while the current command is a group; every `--option` (or
`--option=value`) must be one of the current command's. A `<placeholder>` or `...` word ends the check of its line.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from upscale.api.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
IN_CODE = re.compile(r"(?:^|(?<=[\s($;&|/]))upscale[ \t]+[^\n]*")
INLINE = re.compile(r"`(upscale[ \t][^`]*)`")
OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "&", "2>&1", ")"}


def command_lines(text: str) -> list[tuple[int, str]]:
    """(line number, the command line from `upscale` on) of every command line in a markdown text."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        found = IN_CODE.findall(line) if fenced else INLINE.findall(line)
        out += [(number, f) for f in found]
    return out


def words(line: str) -> list[str]:
    """The words of one command line after `upscale`, up to a shell operator or the end of a `$( … )`."""
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>()")
        lexer.whitespace_split, lexer.commenters = True, "#"
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: a line cut short in prose
        return []
    out = []
    for token in tokens[1:]:
        if token in OPERATORS or token.startswith(("|", "&", ";", ">", "(", ")")):
            break
        out.append(token)
    return out


def problem(args: list[str]) -> str | None:
    """What of ``args`` the CLI tree does not have, or None."""
    command = typer.main.get_command(app)
    path = ["upscale"]
    for word in args:
        if word.startswith("<") or word.endswith("...") or word == "…":
            return None
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
            if name not in known:
                return f"`{' '.join(path)}` has no option {name}"
        elif hasattr(command, "commands") and not word.startswith("-"):  # a group (typer's click, not `click`)
            sub = command.get_command(None, word)
            if sub is None:
                return f"`{' '.join(path)}` has no command {word!r}"
            command, path = sub, [*path, word]
    return None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_command_line_names_what_the_cli_has(doc: Path) -> None:
    wrong = [f"{doc.relative_to(ROOT)}:{n}: {why} ({line.strip()})"
             for n, line in command_lines(doc.read_text()) if (why := problem(words(line)))]
    assert not wrong, "\n".join(wrong)


def test_a_command_or_option_the_cli_lacks_is_caught() -> None:
    assert problem(words("upscale status --api $API")) is None
    assert problem(words("upscale sweeps --api $API")) == "`upscale sweeps` has no option --api"
    assert problem(words("upscale refit schedule list --api $API   # when")) is None
    assert problem(words("upscale refit schedul list")) == "`upscale refit` has no command 'schedul'"
    assert problem(words("upscale fit --law=joint --data x.csv | head")) is None
    assert command_lines("```bash\nSCHEDULE=$(upscale refit run X --api $API)\n```")[0][1].startswith("upscale refit")
