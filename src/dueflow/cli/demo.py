"""``dueflow demo``: a simulated sale of each flow, in process or over HTTP against a
``dueflow serve`` (the players live in :mod:`dueflow.demo`)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from dueflow.cli._common import err, out, run


class DemoFlow(StrEnum):
    """What ``dueflow demo`` sells."""

    MARKETPLACE = "marketplace"
    TICKETS = "tickets"
    SHOP = "shop"


def demo(
    orders_count: int = typer.Option(60, "--orders", min=1, max=5000, help="Orders to simulate."),
    speed: float = typer.Option(
        30.0, min=1.0, max=600.0, help="Simulated seconds per real second."
    ),
    db: Path | None = typer.Option(None, help="SQLite file (default: a fresh temporary one)."),
    seed: int = typer.Option(7, help="Random seed of the simulated people."),
    live: bool = typer.Option(True, help="Show the live progress view."),
    url: str | None = typer.Option(
        None,
        help="Run over HTTP against a `dueflow serve` (dev profile) at this URL, like "
        "http://127.0.0.1:8000, in the server's real time (--speed and --db do not apply).",
    ),
    admin_token: str | None = typer.Option(
        None,
        "--admin-token",
        envvar="DUEFLOW_ADMIN_TOKEN",
        help="An admin's bearer token on the --url server.",
    ),
    flow: DemoFlow = typer.Option(
        DemoFlow.MARKETPLACE,
        help="What to sell: goods (marketplace), the seats of a show (tickets) or a shop's SKUs, "
        "coupons and a flash sale (shop); for tickets and shop --orders is the number of buyers.",
    ),
) -> None:
    """A simulated marketplace on the dev profile: buyers that pay, pay late, never pay or cancel;
    sellers that ship, ship late or never (or, with --flow tickets, a ticket sale: buyers racing
    for the same seats, a show cancelled; with --flow shop, a shop: stock, coupons, a flash
    sale, orders that expire). Ends with a table of outcomes and checked invariants."""
    # The marketplace plays orders, the other flows buyers.
    count = {"orders" if flow is DemoFlow.MARKETPLACE else "buyers": orders_count}
    players: dict[DemoFlow, Callable[..., Coroutine[Any, Any, bool]]]
    if url is not None:
        from dueflow.demo import http as demo_http
        from dueflow.demo import http_shop as demo_http_shop
        from dueflow.demo import http_tickets as demo_http_tickets

        if not admin_token:
            err.print(
                "[red]error:[/red] --url needs an admin token: --admin-token or DUEFLOW_ADMIN_TOKEN"
            )
            raise typer.Exit(2)
        players = {
            DemoFlow.MARKETPLACE: demo_http.run,
            DemoFlow.TICKETS: demo_http_tickets.run,
            DemoFlow.SHOP: demo_http_shop.run,
        }
        sale = players[flow](
            url=url, admin_token=admin_token, seed=seed, live=live, console=out, **count
        )
    else:
        from dueflow.demo import marketplace as demo_module
        from dueflow.demo import shop as demo_shop
        from dueflow.demo import tickets as demo_tickets

        players = {
            DemoFlow.MARKETPLACE: demo_module.run,
            DemoFlow.TICKETS: demo_tickets.run,
            DemoFlow.SHOP: demo_shop.run,
        }
        sale = players[flow](speed=speed, db=db, seed=seed, live=live, console=out, **count)
    raise typer.Exit(0 if run(sale) else 1)
