"""``dueflow users add``: create a user and print its bearer token."""

from __future__ import annotations

import typer

from dueflow.cli._common import one_line, out, run, settings_or_exit, with_deps
from dueflow.cli._lazy import accounts

app = typer.Typer(no_args_is_help=True, help="Manage users.")


@app.command("add")
def users_add(
    name: str = typer.Argument(..., callback=one_line),
    admin: bool = typer.Option(False, "--admin", help="Make an admin."),
) -> None:
    """Create a user and print its bearer token (shown once)."""
    user, token = run(
        with_deps(settings_or_exit(), lambda d: accounts.add_user(d, name, admin=admin))
    )
    role = "admin" if user.is_admin else "user"
    out.print(f"{role} {user.name} (id {user.id}) token: {token}", soft_wrap=True)
