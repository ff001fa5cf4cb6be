"""The exception a user of `workers/` can cause (bad size, bad method option, wrong checkpoint).

It subclasses ValueError so that plain callers can catch it as one, and the CLI registers it as a
user error so it prints as one line with exit code 2 instead of a traceback.
"""

from __future__ import annotations

from typing import TypeVar

M = TypeVar("M")


class WorkerError(ValueError):
    """A bad value given to a worker: the message names the value and what would be valid."""


def validated(cls: type[M], **fields: object) -> M:
    """Build a pydantic model, turning its ValidationError into one WorkerError line naming field and value."""
    from pydantic import BaseModel, ValidationError

    assert issubclass(cls, BaseModel)
    try:
        return cls(**fields)
    except ValidationError as e:
        parts = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or cls.__name__
            msg = str(err["msg"]).removeprefix("Value error, ")
            parts.append(f"{where}: {msg}" + (f" (got {err['input']!r})" if err["loc"] else ""))
        raise WorkerError("; ".join(parts)) from None
