"""The shows routes under ``/api/shows``: an organizer puts a show on sale with its seat map,
may cancel it and exports its tickets as CSV; anyone signed in reads a show and its seat map.
Seats are ordered through ``POST /api/orders`` (``show_id`` and ``seats``); tickets are checked
in at ``POST /api/tickets/{code}/check-in`` (:mod:`dueflow.api.tickets`)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, model_validator

from dueflow.api import auth, idempotency
from dueflow.api import schemas as out
from dueflow.api.common import FOR_A_USER, WITH_BODY, WITH_PARAMS, Body, Id, answer, resource
from dueflow.api.schemas import Money, View, errors
from dueflow.domain import seating
from dueflow.domain.money import parse_yuan
from dueflow.error_codes import ErrorCode
from dueflow.exceptions import InvalidInput
from dueflow.service import checkin, tickets
from dueflow.service.deps import Deps

Price = Field(min_length=1, max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?$", examples=["380.00"])
Section = Field(pattern=r"^[A-Za-z][A-Za-z0-9]{0,7}$", examples=["A"])
#: The longest ``seat_ranges`` text, and the most sections ``prices`` names.
MAX_RANGES_TEXT = 4000
MAX_SECTIONS = 200


class NewSeat(Body):
    """One seat: its label (section, optional row, number: ``A-12``), its price in yuan and
    optionally its price tier (its section by default)."""

    label: out.SingleLine = Field(min_length=3, max_length=16, examples=["A-12"])
    price: str = Price
    tier: out.SingleLine | None = Field(default=None, min_length=1, max_length=16)


class NewShow(Body):
    """A show and its seat map; times are ISO 8601 with their offset. The seats are listed one
    by one (``seats``), given as ranges by section (``seat_ranges`` with a price per section in
    ``prices``: 5,000 seats fit in a few bytes), or both (no seat twice)."""

    title: out.SingleLine = Field(min_length=1, max_length=200)
    venue: out.SingleLine = Field(min_length=1, max_length=200)
    starts_at: out.Time
    sales_close_at: out.Time
    seat_limit: int = Field(default=seating.DEFAULT_SEAT_LIMIT, ge=1, le=seating.MAX_SEAT_LIMIT)
    seats: list[NewSeat] | None = Field(default=None, min_length=1, max_length=seating.MAX_SEATS)
    seat_ranges: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_RANGES_TEXT,
        description="seats by section, first and last number: A:1-20 is A-1 to A-20 (its tier "
        "is its section)",
        examples=["A:1-2500,B:1-2500"],
    )
    prices: dict[Annotated[str, Section], Annotated[str, Price]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SECTIONS,
        description="yuan by section, for the seats of seat_ranges",
        examples=[{"A": "380.00", "B": "180.00"}],
    )

    @model_validator(mode="after")
    def _some_seats(self) -> NewShow:
        if self.seats is None and self.seat_ranges is None:
            raise ValueError("give the seats: seats (one by one), seat_ranges with prices, or both")
        if (self.seat_ranges is None) != (self.prices is None):
            raise ValueError("seat_ranges go with prices (yuan by section), and prices with them")
        return self


class SeatCounts(View):
    """How many seats of a show are in each state."""

    free: int
    held: int
    sold: int


class ShowItem(View):
    """A show as its list shows it: its organizer, times, per-buyer seat limit and where its
    sales stand (``GET /api/shows/{id}`` adds the seat counts)."""

    id: int
    organizer_id: int
    title: str
    venue: str
    starts_at: datetime
    sales_close_at: datetime
    seat_limit: int = Field(description="seats one buyer may hold or buy")
    status: str = Field(description="on_sale | cancelled")
    sales: str = Field(
        description="open | closed (past sales_close_at) | started | cancelled (by the organizer)"
    )
    cancelled_at: datetime | None
    created_at: datetime
    updated_at: datetime


class ShowView(ShowItem):
    """A show: its organizer, times, per-buyer seat limit and seat counts."""

    seats: SeatCounts


class SeatView(View):
    """One seat of a show and its state."""

    label: str
    section: str
    row: str | None
    number: int
    tier: str
    price: Money
    state: str = Field(
        description="free | held | sold | not_for_sale (no order holds it, and sales are not open)"
    )


class SeatMap(View):
    """Where the show's sales stand, and every seat of it in seat order."""

    show_id: int
    sales: str = Field(description="as the show's")
    seats: list[SeatView]


class ShowCancelled(View):
    """The cancelled show, and how many live orders the worker is cancelling."""

    show: ShowView
    orders_to_cancel: int


def _price(value: str, what: str, field: str) -> Decimal:
    try:
        return parse_yuan(value)
    except InvalidInput as exc:
        raise InvalidInput(f"{what}: {exc.message}", field=field) from None


def seats_of(body: NewShow) -> list[seating.SeatSpec]:
    """The seats the body lists and those its ranges hold (the show's rules are checked when
    it is created: no seat twice, at most :data:`~dueflow.domain.seating.MAX_SEATS`).

    Raises:
        InvalidInput: a bad label, price or range, a section without a price, a price for a
            section the ranges do not have.
    """
    specs = [
        seating.seat(s.label, _price(s.price, f"seat {s.label}", f"seats[{n}].price"), s.tier)
        for n, s in enumerate(body.seats or [])
    ]
    if body.seat_ranges is not None and body.prices is not None:
        prices = {
            section: _price(value, f"prices.{section}", f"prices.{section}")
            for section, value in body.prices.items()
        }
        ranged = seating.parse_ranges(
            body.seat_ranges,
            prices,
            give_price='give it in prices: {{"{section}": "380.00"}}',
        )
        unused = sorted(set(prices) - {s.section for s in ranged})
        if unused:
            raise InvalidInput(
                f"prices: no seat range of section {', '.join(unused)}", field="prices"
            )
        specs.extend(ranged)
    return specs


def router(deps: Deps) -> APIRouter:
    """The ``/api/shows`` routes over ``deps``."""
    codes = [*FOR_A_USER, ErrorCode.NOT_FOUND]
    api = resource("/api/shows", auth.current_user(deps, "catalog"), codes, tag="shows")
    keyed = idempotency.idempotent(deps)

    @api.post("", status_code=201, response_model=ShowView, responses=errors(*WITH_BODY))
    @keyed
    async def add_show(body: NewShow, request: Request) -> JSONResponse:
        """Put a show on sale with its seats, the caller its organizer."""
        user = auth.caller(request)
        specs = seats_of(body)
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
        return answer(await tickets.show_view(deps, show_id), 201)

    @api.get("/{show_id}", response_model=ShowView, responses=errors(*WITH_PARAMS))
    async def get_show(show_id: Id) -> JSONResponse:
        """The show, and how many of its seats are free, held and sold."""
        return answer(await tickets.show_view(deps, show_id))

    @api.get("/{show_id}/seats", response_model=SeatMap, responses=errors(*WITH_PARAMS))
    async def get_seats(show_id: Id) -> JSONResponse:
        """Where the show's sales stand and every seat's state: free, held (by an unpaid
        order), sold, or not_for_sale (no order holds it and the show sells no more)."""
        return answer(await tickets.buyers_seat_map(deps, show_id))

    @api.post(
        "/{show_id}/cancel",
        response_model=ShowCancelled,
        responses=errors(*WITH_PARAMS, ErrorCode.NOT_ALLOWED, ErrorCode.INVALID_TRANSITION),
    )
    @keyed
    async def cancel_show(show_id: Id, request: Request) -> JSONResponse:
        """The organizer cancels the show: no more orders; every live order is cancelled by
        the worker shortly after (paid ones with a refund awaiting review)."""
        user = auth.caller(request)
        count = await tickets.cancel_show(deps, show_id=show_id, user_id=user.id)
        view = await tickets.show_view(deps, show_id)
        return answer({"show": view, "orders_to_cancel": count})

    @api.get(
        "/{show_id}/tickets.csv",
        response_class=Response,
        responses={
            200: {
                "description": "the tickets, a header line first",
                "content": {"text/csv": {"schema": {"type": "string"}}},
            },
            **errors(*WITH_PARAMS),
        },
    )
    async def tickets_csv(show_id: Id, request: Request) -> Response:
        """The show's tickets in seat order as CSV (seat, code, buyer, state, checked_in_at,
        gate), for its organizer or an admin (anyone else: 404)."""
        found = await checkin.show_tickets(deps, show_id, auth.caller(request))
        return csv_answer(checkin.tickets_csv(found), f"show-{show_id}-tickets.csv")

    return api


def csv_answer(body: str, filename: str) -> Response:
    """A CSV download named ``filename``."""
    return Response(
        body,
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
