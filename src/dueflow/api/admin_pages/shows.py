"""The shows pages under ``/admin/shows``: every show with its seat counts, and one show with
its counts per state, its seat map drawn as a grid (free, held, sold; a taken seat links to the
order that holds it) and its orders.

:func:`add_routes` puts them on the admin router, behind the same session as every admin page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from dueflow.api.admin_pages.site import Pages
from dueflow.service import people, report, tickets
from dueflow.service.accounts import User

#: Shows on the list page, newest first.
SHOWS_LISTED = 200
#: Orders on a show's page, newest first.
ORDERS_LISTED = 500
#: The seat map's state of a seat no order holds.
FREE = "free"


@dataclass(frozen=True)
class SeatRow:
    """One row of a section (``name`` None for a section without rows), seats by number."""

    name: str | None
    seats: list[dict[str, Any]]


@dataclass(frozen=True)
class Section:
    """One section of the seat map and its rows, in the order the show lists them."""

    name: str
    rows: list[SeatRow]


def seat_grid(seat_map: Sequence[Mapping[str, Any]]) -> list[Section]:
    """The seat map as sections of rows of seats. Each seat gains ``stale``: the state shown
    (the seat cache's, when there is one) disagrees with the database on whether an order
    holds the seat, which the reconciler repairs within its interval."""
    sections: dict[str, dict[str | None, list[dict[str, Any]]]] = {}
    for seat in seat_map:
        held = seat["order_id"] is not None
        row = sections.setdefault(seat["section"], {}).setdefault(seat["row"], [])
        row.append({**seat, "stale": held == (seat["state"] == FREE)})
    return [
        Section(
            name, [SeatRow(row, sorted(s, key=lambda x: x["number"])) for row, s in rows.items()]
        )
        for name, rows in sections.items()
    ]


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """``GET /admin/shows`` and ``GET /admin/shows/{id}`` on the admin router."""
    deps = pages.deps

    @routes.get("/shows", response_class=HTMLResponse)
    async def show_list(request: Request) -> Response:
        return await pages.listing(
            request, "shows.html", "shows", report.shows_overview, SHOWS_LISTED
        )

    @routes.get("/shows/{show_id}", response_class=HTMLResponse)
    async def show_page(request: Request, show_id: str) -> Response:
        async def load(found: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            return await tickets.show_view(deps, found), await tickets.seat_map(deps, found)

        async def render(
            user: User, found: int, loaded: tuple[dict[str, Any], list[dict[str, Any]]]
        ) -> Response:
            show, seat_map = loaded
            counts = show["seats"]
            # A cancelled show is still moving while its orders are being cancelled.
            moving = show["status"] == "on_sale" or counts["held"] + counts["sold"] > 0
            return pages.page(
                request,
                "show.html",
                user=user,
                show=show,
                names=await people.names(deps, [show["organizer_id"]]),
                sections=seat_grid(seat_map),
                orders=await tickets.show_orders(deps, found, ORDERS_LISTED),
                limit=ORDERS_LISTED,
                refresh=5 if moving else 0,
            )

        return await pages.one(request, "show", show_id, load, render)
