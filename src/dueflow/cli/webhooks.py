"""``dueflow webhooks add | list | show | enable | disable | types | rotate | replay | delete``:
the webhook endpoints (:mod:`dueflow.service.webhook_endpoints`). A secret is printed by ``add``
and ``rotate`` only."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import typer

from dueflow.cli._common import out, run, settings_or_exit, with_deps
from dueflow.cli._lazy import render, webhook_endpoints

app = typer.Typer(no_args_is_help=True, help="Manage the webhook endpoints.")
ACTOR = "cli"


def _types(row: Mapping[str, Any]) -> str:
    return " ".join(row["event_types"] or ["(all)"])


@app.command("add")
def webhooks_add(
    url: str = typer.Argument(..., help="http(s) URL of the endpoint"),
    event_type: list[str] = typer.Option(
        [], "--type", help="an event type to send (repeat; none: every event)"
    ),
    description: str | None = typer.Option(None, "--description"),
) -> None:
    """Make an endpoint and print its secret (shown once)."""
    made = run(
        with_deps(
            settings_or_exit(),
            lambda d: webhook_endpoints.create(
                d, url=url, event_types=event_type, description=description, actor=ACTOR
            ),
        )
    )
    out.print(f"endpoint {made['id']} ({_types(made)}) secret: {made['secret']}", soft_wrap=True)


@app.command("list")
def webhooks_list(limit: int = typer.Option(20, "--limit", min=1, max=100)) -> None:
    """The endpoints, newest first, with their backlog and failures."""
    page = run(
        with_deps(settings_or_exit(), lambda d: webhook_endpoints.page(d, after=None, limit=limit))
    )
    columns: dict[str, render.Column] = {
        "id": "id",
        "url": "url",
        "types": _types,
        "enabled": lambda r: "yes" if r["enabled"] else "no",
        "backlog": lambda r: str(r["status"]["backlog"]),
        "failures": lambda r: str(r["status"]["failures"]),
        "last error": lambda r: r["status"]["last_error"] or "",
    }
    out.print(render.table_of(page.items, columns, title="webhook endpoints"))


@app.command("show")
def webhooks_show(endpoint_id: int) -> None:
    """One endpoint and where its deliveries stand."""
    found = run(with_deps(settings_or_exit(), lambda d: webhook_endpoints.show(d, endpoint_id)))
    status = found.pop("status")
    for key, value in {**found, **status}.items():
        out.print(f"{key}: {value}", soft_wrap=True)


def _change(endpoint_id: int, changes: dict[str, Any]) -> None:
    found = run(
        with_deps(
            settings_or_exit(),
            lambda d: webhook_endpoints.update(d, endpoint_id, changes=changes, actor=ACTOR),
        )
    )
    state = "enabled" if found["enabled"] else "disabled"
    out.print(f"endpoint {endpoint_id}: {state}, types {_types(found)}")


@app.command("enable")
def webhooks_enable(endpoint_id: int) -> None:
    """Deliver to the endpoint again (from where its stream stands)."""
    _change(endpoint_id, {"enabled": True})


@app.command("disable")
def webhooks_disable(endpoint_id: int) -> None:
    """Stop delivering to the endpoint (its position is kept)."""
    _change(endpoint_id, {"enabled": False})


@app.command("types")
def webhooks_types(
    endpoint_id: int,
    event_type: list[str] = typer.Argument(None, help="event types (none: every event)"),
) -> None:
    """Set the event types the endpoint is sent."""
    _change(endpoint_id, {"event_types": event_type or None})


@app.command("rotate")
def webhooks_rotate(
    endpoint_id: int,
    keep_old_for: int = typer.Option(
        86_400, "--keep-old-for", min=0, help="seconds the old secret signs beside the new"
    ),
) -> None:
    """Give the endpoint a new secret and print it (shown once)."""
    found = run(
        with_deps(
            settings_or_exit(),
            lambda d: webhook_endpoints.rotate(
                d, endpoint_id, keep_old_for=timedelta(seconds=keep_old_for), actor=ACTOR
            ),
        )
    )
    out.print(f"endpoint {endpoint_id} secret: {found['secret']}", soft_wrap=True)


@app.command("replay")
def webhooks_replay(endpoint_id: int, first: int, last: int | None = typer.Argument(None)) -> None:
    """Deliver the events FIRST to LAST (by seq) again to the endpoint."""
    told = run(
        with_deps(
            settings_or_exit(),
            lambda d: webhook_endpoints.replay(d, endpoint_id, first=first, last=last, actor=ACTOR),
        )
    )
    out.print(told)


@app.command("delete")
def webhooks_delete(endpoint_id: int) -> None:
    """Delete the endpoint and its streams."""
    run(
        with_deps(
            settings_or_exit(), lambda d: webhook_endpoints.delete(d, endpoint_id, actor=ACTOR)
        )
    )
    out.print(f"endpoint {endpoint_id} deleted")
