"""``dueflow keys``: the service keys a host application's back end calls with: add (the secret
is printed once), list, rotate (a new key; the old one works until revoked), revoke. Each change
is recorded as made by ``cli`` (``created_by``) and logged without the secret."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import typer

from dueflow.cli._common import one_line, out, run, settings_or_exit, with_deps
from dueflow.cli._lazy import render, service_keys
from dueflow.domain import times

app = typer.Typer(no_args_is_help=True, help="Manage service keys: add, list, rotate, revoke.")

#: Who the command line is, in what keys record.
BY = "cli"


def _expiry(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return times.parse(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--expires-at") from None


def _made(made: dict[str, Any], secret: str, what: str) -> None:
    scopes = " ".join(made["scopes"])
    out.print(f"{what} key {made['id']} {made['name']!r} scopes: {scopes}", soft_wrap=True)
    out.print(f"secret (shown once): {secret}", soft_wrap=True, highlight=False)


@app.command("add")
def keys_add(
    name: str = typer.Argument(..., callback=one_line),
    scope: list[str] = typer.Option(
        ..., "--scope", help="orders, catalog, payments, events or admin; repeat for more."
    ),
    expires_at: str | None = typer.Option(
        None, help="When it stops working: ISO 8601 with offset (never if not given)."
    ),
) -> None:
    """Make a service key and print its secret (shown once, stored hashed)."""
    expiry = _expiry(expires_at)
    made, secret = run(
        with_deps(
            settings_or_exit(),
            lambda d: service_keys.add_key(d, name=name, scopes=scope, expires_at=expiry, by=BY),
        )
    )
    _made(made, secret, "added")


@app.command("list")
def keys_list(
    limit: int = typer.Option(100, min=1, max=100, help="At most this many, newest first."),
) -> None:
    """Service keys, newest first (never their secrets)."""
    page = run(
        with_deps(settings_or_exit(), lambda d: service_keys.keys_page(d, after=None, limit=limit))
    )
    columns: dict[str, render.Column] = {
        "id": "id",
        "name": "name",
        "prefix": "prefix",
        "scopes": lambda row: " ".join(row["scopes"]),
        "state": "state",
        "expires": "expires_at",
        "made by": "created_by",
        "rotated from": "rotated_from",
    }
    out.print(render.table_of(page.items, columns))


@app.command("rotate")
def keys_rotate(key_id: int) -> None:
    """Make a new key replacing KEY_ID (same name, scopes, expiry) and print its secret; the old
    key keeps working until revoked."""
    made, secret = run(
        with_deps(settings_or_exit(), lambda d: service_keys.rotate(d, key_id, by=BY))
    )
    _made(made, secret, f"key {key_id} rotated:")


@app.command("revoke")
def keys_revoke(key_id: int) -> None:
    """Revoke a key: its next request is refused."""
    run(with_deps(settings_or_exit(), lambda d: service_keys.revoke(d, key_id, by=BY)))
    out.print(f"key {key_id} revoked")
