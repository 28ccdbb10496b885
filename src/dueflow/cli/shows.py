"""The ``dueflow shows`` commands (add, show, cancel) and the seats case of ``dueflow orders
place``: an organizer puts a show on sale with its seat map, anyone reads it as a grid in the
terminal, the organizer cancels it.

It takes the error handling and the output consoles from :mod:`dueflow.cli._common`;
:mod:`dueflow.cli` registers its typer app.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dueflow.cli._common import one_line, out, run, settings_or_exit, with_deps
from dueflow.cli._lazy import accounts, show_states, tickets
from dueflow.domain import seating, times
from dueflow.domain.money import parse_yuan
from dueflow.exceptions import InvalidInput

if TYPE_CHECKING:
    from dueflow.service.deps import Deps

app = typer.Typer(no_args_is_help=True, help="Put shows on sale, read their seat maps, cancel.")


def _time(value: str, option: str) -> datetime:
    """An ISO 8601 time with its offset, within what every database stores (a usage error,
    exit 2, otherwise)."""
    try:
        return times.parse(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def prices_by_section(pairs: Sequence[str]) -> dict[str, Decimal]:
    """``["A=380", "B=180"]`` -> ``{"A": Decimal("380.00"), ...}``.

    Raises:
        InvalidInput: a pair is not ``SECTION=YUAN``, a section is priced twice, a bad amount.
    """
    prices: dict[str, Decimal] = {}
    for pair in pairs:
        section, sep, amount = pair.partition("=")
        section = section.strip()
        if not sep or not section:
            raise InvalidInput(f"--price {pair!r}: use SECTION=YUAN, like A=380")
        if section in prices:
            raise InvalidInput(f"--price: section {section} is priced twice")
        try:
            prices[section] = parse_yuan(amount.strip())
        except InvalidInput as exc:
            raise InvalidInput(f"--price {pair!r}: {exc.message}") from None
    return prices


def seat_labels(value: str) -> list[str]:
    """``"A-1, A-2"`` -> ``["A-1", "A-2"]`` (empty parts dropped; the service checks the rest)."""
    return [label.strip() for label in value.split(",") if label.strip()]


def seat_grid(seats: Sequence[dict[str, Any]]) -> list[str]:
    """The seat map as text: one line per section (and row), one character per seat number
    (``.`` free, ``h`` held, ``S`` sold, a space for a number the row does not have)."""
    grid_mark = {show_states.FREE: ".", show_states.HELD: "h", show_states.SOLD: "S"}
    rows: dict[str, dict[int, str]] = defaultdict(dict)
    for s in seats:
        name = s["section"] if s["row"] is None else f"{s['section']}-{s['row']}"
        rows[name][s["number"]] = grid_mark.get(s["state"], "?")
    width = max((len(name) for name in rows), default=0)
    lines = []
    for name, marks in rows.items():
        last = max(marks)
        cells = "".join(marks.get(n, " ") for n in range(1, last + 1))
        lines.append(f"  {name:<{width}} {cells}")
    return lines


def _tiers(seats: Sequence[seating.SeatSpec]) -> str:
    count: dict[str, int] = defaultdict(int)
    price: dict[str, Decimal] = {}
    for s in seats:
        count[s.tier] += 1
        price[s.tier] = s.price
    return ", ".join(f"{tier} {n} at {price[tier]}" for tier, n in count.items())


@app.command("add")
def shows_add(
    price: Annotated[list[str], typer.Option(help="A section's price in yuan: A=380 (repeat).")],
    organizer: str = typer.Option(..., help="The organizing user's name."),
    title: str = typer.Option(..., callback=one_line),
    venue: str = typer.Option(..., callback=one_line),
    starts_at: str = typer.Option(..., help="ISO 8601 with offset: 2026-12-24T19:30:00+08:00."),
    sales_close_at: str = typer.Option(..., help="ISO 8601 with offset; at or before the start."),
    limit: int = typer.Option(
        seating.DEFAULT_SEAT_LIMIT, min=1, max=seating.MAX_SEAT_LIMIT, help="Seats a buyer."
    ),
    seats: str = typer.Option(..., help="Seat ranges by section: 'A:1-20,B:1-20'."),
) -> None:
    """Put a show on sale with its seat map; prints its id and its seats per tier."""
    starts, closes = _time(starts_at, "--starts-at"), _time(sales_close_at, "--sales-close-at")

    async def go(deps: Deps) -> tuple[int, list[seating.SeatSpec]]:
        specs = seating.parse_ranges(seats, prices_by_section(price))
        user = await accounts.get_user(deps, organizer)
        show_id = await tickets.create_show(
            deps,
            organizer_id=user.id,
            title=title,
            venue=venue,
            starts_at=starts,
            sales_close_at=closes,
            seat_limit=limit,
            seats=specs,
        )
        return show_id, specs

    show_id, specs = run(with_deps(settings_or_exit(), go))
    out.print(
        f"show {show_id} on sale: {title} at {venue}, {len(specs)} seats ({_tiers(specs)})",
        soft_wrap=True,
    )


@app.command("show")
def shows_show(show_id: int) -> None:
    """The show, its seat counts and its seat map (. free, h held, S sold)."""

    async def go(deps: Deps) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return await tickets.show_view(deps, show_id), await tickets.seat_map(deps, show_id)

    show, seats = run(with_deps(settings_or_exit(), go))
    counts = show["seats"]
    out.print(
        f"show {show['id']} {show['status']}: {show['title']} at {show['venue']}  "
        f"organizer {show['organizer_id']}  limit {show['seat_limit']} seats a buyer",
        soft_wrap=True,
        highlight=False,
    )
    out.print(f"  starts at: {show['starts_at']:%Y-%m-%d %H:%M:%S} UTC", highlight=False)
    out.print(f"  sales close at: {show['sales_close_at']:%Y-%m-%d %H:%M:%S} UTC", highlight=False)
    out.print(
        f"  seats: {counts['free']} free, {counts['held']} held, {counts['sold']} sold",
        highlight=False,
    )
    for line in seat_grid(seats):
        out.print(line, highlight=False, markup=False, soft_wrap=True)


@app.command("cancel")
def shows_cancel(
    show_id: int, user: str = typer.Option(..., "--as", help="The organizer's name.")
) -> None:
    """The organizer cancels the show: the worker then cancels every live order (refunding
    the paid ones after review)."""

    async def go(deps: Deps) -> int:
        organizer = await accounts.get_user(deps, user)
        return await tickets.cancel_show(deps, show_id=show_id, user_id=organizer.id)

    count = run(with_deps(settings_or_exit(), go))
    orders = "1 live order" if count == 1 else f"{count} live orders"
    out.print(f"show {show_id} cancelled: {orders} to cancel (by the worker)")


def place_seats(show_id: int, seats: str, buyer: str) -> None:
    """``dueflow orders place --show ID --seats A-1,A-2 --buyer NAME``: hold the seats for a
    new ``ticket`` order and print it."""

    async def go(deps: Deps) -> dict[str, Any]:
        user = await accounts.get_user(deps, buyer)
        return await tickets.place_ticket_order(
            deps, buyer_id=user.id, show_id=show_id, labels=seat_labels(seats)
        )

    view = run(with_deps(settings_or_exit(), go))
    held = ", ".join(line["label"] for line in view["lines"])
    out.print(
        f"order {view['id']} {view['status']}: {view['amount']} for seats {held} of show "
        f"{show_id}, due by {view['pay_deadline']:%Y-%m-%d %H:%M:%S} UTC",
        soft_wrap=True,
        highlight=False,
    )
