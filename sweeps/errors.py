"""The error a sweep spec the user must fix raises, with every problem's field path. Its own module so that
what validation reads (sweeps/data_sources.py, sweeps/model_dirs.py) can raise it without importing the spec."""

from __future__ import annotations

from collections.abc import Sequence

SpecProblem = tuple[str, str]  # (field path, message)
MAX_MESSAGE_CHARS = 400  # of one problem's message (a YAML parser's message quotes the offending line)
MAX_PROBLEMS = 50  # listed in one SpecError; the rest are counted


def _bounded(text: str) -> str:
    """A problem's path or message cut to MAX_MESSAGE_CHARS (a path through long keys, a parser's quoted line)."""
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS - 1] + "…"


class SpecError(ValueError):
    """A sweep spec the user must fix: every problem, each with the field path it concerns."""

    def __init__(self, problems: Sequence[SpecProblem]):
        kept = [(_bounded(path), _bounded(msg)) for path, msg in problems[:MAX_PROBLEMS]]
        if len(problems) > MAX_PROBLEMS:
            kept.append(("", f"... and {len(problems) - MAX_PROBLEMS} more problems"))
        self.problems: tuple[SpecProblem, ...] = tuple(kept)
        super().__init__(str(self))

    def __str__(self) -> str:
        n = len(self.problems)
        lines = [f"{path or '<spec>'}: {msg}" for path, msg in self.problems]
        if n == 1:  # one line, as the CLI's other errors are
            return f"invalid sweep spec: {lines[0]}"
        return f"invalid sweep spec ({n} problems):\n  " + "\n  ".join(lines)


def raise_if(problems: Sequence[SpecProblem]) -> None:
    """SpecError with ``problems``, if there are any."""
    if problems:
        raise SpecError(problems)
