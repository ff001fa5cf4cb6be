"""`upscale token create|list|revoke`: the API's bearer tokens, on this machine's store (whoever holds the database
manages its tokens). A revoked or expired token is refused by the very next request to any server on the store."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.table import Table

from upscale.api.cli.app import CommandError, console, err_console

token_app = typer.Typer(help="API bearer tokens: create, list, revoke.", no_args_is_help=True)
SCOPE_HELP = "read (sees everything), write (also creates, and changes what NAME owns) or admin (changes anything)."


def _store():
    from upscale.api.cli.local import local_services

    return local_services().store


@token_app.command("create")
def token_create_command(
    name: Annotated[str, typer.Argument(help="Who holds it: the owner of what it creates. Default: $USER.")]
    = os.environ.get("USER", "user"),
    scope: Annotated[str, typer.Option(help=SCOPE_HELP)] = "read",
    expires: Annotated[float | None, typer.Option(help="Refused after this many days (fractions allowed); default: "
                                                  "never expires (`upscale token revoke` ends it).")] = None,
) -> None:
    """Print a new bearer token (shown once; only its sha256 is stored)."""
    from upscale.control.tokens import SCOPES, create_token, expiry

    if scope not in SCOPES:
        raise CommandError(f"--scope {scope!r}: use {', '.join(SCOPES)}")
    if expires is not None and not 0 < expires < 36500:
        raise CommandError(f"--expires {expires:g}: give a number of days above 0 and below 36500, or leave it out")
    print(create_token(_store(), scope, name, expiry(expires)))  # type: ignore[arg-type]


@token_app.command("list")
def token_list_command() -> None:
    """Every token: name, id, scope, created, expires and state (active, expired or revoked); never the token."""
    from upscale.control.tokens import state, tokens
    from upscale.orchestrator.clock import as_utc

    def when(t) -> str:
        return "" if t is None else f"{as_utc(t):%Y-%m-%d %H:%M} UTC"

    t = Table("name", "id", "scope", "created", "expires", "state")
    for record in tokens(_store()):
        status = state(record)
        t.add_row(record.name, record.id, record.scope, when(record.created_at), when(record.expires_at) or "never",
                  f"revoked {when(record.revoked_at)}" if status == "revoked" else status)
    console.print(t)


@token_app.command("revoke")
def token_revoke_command(
    name_or_id: Annotated[str, typer.Argument(help="A token id (`upscale token list`), or a name: all its tokens.")],
) -> None:
    """Revoke one token by id, or every token of a name: refused from the next request on, by every server on this
    store."""
    from upscale.control.tokens import revoke

    ids = revoke(_store(), name_or_id)
    if not ids:
        raise CommandError(f"no active token with id or name {name_or_id!r}; `upscale token list` lists them")
    err_console.print(f"revoked {len(ids)} token{'s' * (len(ids) != 1)}: {', '.join(ids)}")
