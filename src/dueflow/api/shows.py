"""The shows routes under ``/api/shows``: an organizer puts a show on sale with its seat map and
may cancel it; anyone signed in reads a show and its seat map. Seats are ordered through
``POST /api/orders`` (``show_id`` and ``seats``)."""

from __future__ import annotations

from decimal import Decimal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from dueflow.api import auth, routes
from dueflow.api import schemas as out
from dueflow.api.schemas import errors
from dueflow.domain import seating
from dueflow.domain.money import parse_yuan
from dueflow.exceptions import InvalidInput
from dueflow.service import tickets
from dueflow.service.deps import Deps

Price = Field(min_length=1, max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?$", examples=["380.00"])


class NewSeat(routes.Body):
    """One seat: its label (section, optional row, number: ``A-12``), its price in yuan and
    optionally its price tier (its section by default)."""

    label: out.SingleLine = Field(min_length=3, max_length=16, examples=["A-12"])
    price: str = Price
    tier: out.SingleLine | None = Field(default=None, min_length=1, max_length=16)


class NewShow(routes.Body):
    """A show and its seat map; times are ISO 8601 with their offset."""

    title: out.SingleLine = Field(min_length=1, max_length=200)
    venue: out.SingleLine = Field(min_length=1, max_length=200)
    starts_at: out.Time
    sales_close_at: out.Time
    seat_limit: int = Field(default=seating.DEFAULT_SEAT_LIMIT, ge=1, le=seating.MAX_SEAT_LIMIT)
    seats: list[NewSeat] = Field(min_length=1, max_length=seating.MAX_SEATS)


def _price(value: str, label: str) -> Decimal:
    try:
        return parse_yuan(value)
    except InvalidInput as exc:
        raise InvalidInput(f"seat {label}: {exc.message}") from None


def router(deps: Deps) -> APIRouter:
    """The ``/api/shows`` routes over ``deps``."""
    api = APIRouter(
        prefix="/api/shows",
        tags=["shows"],
        dependencies=[Depends(auth.current_user(deps))],
        responses=errors(401, 404, 413, 422, 503),
    )

    @api.post("", status_code=201, response_model=out.ShowView, responses=errors(400))
    async def add_show(body: NewShow, request: Request) -> JSONResponse:
        """Put a show on sale with its seats, the caller its organizer."""
        user = auth.caller(request)
        specs = [seating.seat(s.label, _price(s.price, s.label), s.tier) for s in body.seats]
        show_id = await tickets.create_show(
            deps,
            organizer_id=user.id,
            title=body.title,
            venue=body.venue,
            starts_at=body.starts_at,
            sales_close_at=body.sales_close_at,
            seat_limit=body.seat_limit,
            seats=specs,
        )
        return routes.answer(await tickets.show_view(deps, show_id), 201)

    @api.get("/{show_id}", response_model=out.ShowView)
    async def get_show(show_id: routes.Id) -> JSONResponse:
        """The show, and how many of its seats are free, held and sold."""
        return routes.answer(await tickets.show_view(deps, show_id))

    @api.get("/{show_id}/seats", response_model=out.SeatMap)
    async def get_seats(show_id: routes.Id) -> JSONResponse:
        """Where the show's sales stand and every seat's state: free, held (by an unpaid
        order), sold, or not_for_sale (no order holds it and the show sells no more)."""
        return routes.answer(await tickets.buyers_seat_map(deps, show_id))

    @api.post("/{show_id}/cancel", response_model=out.ShowCancelled, responses=errors(403, 409))
    async def cancel_show(show_id: routes.Id, request: Request) -> JSONResponse:
        """The organizer cancels the show: no more orders; every live order is cancelled by
        the worker shortly after (paid ones with a refund awaiting review)."""
        user = auth.caller(request)
        count = await tickets.cancel_show(deps, show_id=show_id, user_id=user.id)
        view = await tickets.show_view(deps, show_id)
        return routes.answer({"show": view, "orders_to_cancel": count})

    return api
