"""``dueflow demo --flow tickets``: a simulated ticket sale on the dev profile, in fast time.

An organizer puts a show on sale (three sections of 20 seats, four seats a buyer). Buyers come in
waves, every buyer of a wave at the same moment, most of them after the same front seats: the
database gives each seat to one order and refuses the rest (a refused buyer looks at the seat map
and tries the best seats left). Some buyers place two orders at once, together past the limit.
Each order then follows one of :data:`dueflow.demo.marketplace.BUYER_HABITS`: paid through the
simulated Alipay or WeChat Pay, paid at the wire, never paid (the pay deadline lets the seats go),
cancelled, or paid by a late bank transfer after the order was cancelled (a discrepancy and a
refund). Then the organizer cancels the show: unpaid orders are cancelled, paid ones refunded
(pending review), their tickets void, and latecomers find sales closed.

The invariants are read from the database many times during the sale and once at the end.
"""

from __future__ import annotations

import asyncio
import random
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table
from sqlalchemy import case, func, select

from dueflow import render
from dueflow.demo import marketplace
from dueflow.domain import seating
from dueflow.domain.lifecycle import CANCELLED_STATUSES, OrderStatus
from dueflow.exceptions import DueflowError
from dueflow.notifiers.log import LogNotifier
from dueflow.service import accounts, tickets
from dueflow.service.deps import Deps
from dueflow.service.report import Invariants
from dueflow.store import shows
from dueflow.store.schema import order_lines, payments, refunds, seat_holds
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import tickets as t_tickets

SEATS = "A:1-20,B:1-20,C:1-20"
PRICES = {"A": Decimal("380.00"), "B": Decimal("280.00"), "C": Decimal("180.00")}
SEAT_LIMIT = 4
#: The front seats everyone wants (A-1 .. A-8) and how many first choices go for them.
FRONT, FRONT_SHARE = 8, 0.75
#: When each wave of buyers comes, the show cancel and the latecomers, in pay windows.
WAVES = (0.0, 0.5, 1.1, 1.7)
SHOW_CANCEL_AT, LATECOMERS_AT = 2.2, 2.3
LATECOMERS = 3
#: Buyers who place two orders of three seats at once (together past the limit of four).
GREEDY = 0.15
#: Real seconds between two checks of the invariants during the sale.
CHECK_EVERY = 0.1
REFUND_NAME = "every paid-then-cancelled order has a refund"


def seat_order(label: str) -> tuple[str, str, int]:
    """The order seats are best in: section, row, number."""
    section, row, number = seating.parse_label(label)
    return section, row or "", number


def pick_seats(rng: random.Random, count: int, free: Sequence[str] | None = None) -> list[str]:
    """``count`` seats a buyer asks for: mostly side by side among the front seats, else
    anywhere; with ``free`` (the seat map as the buyer saw it) among the best free seats, none
    when too few are left."""
    if free is None:
        if rng.random() < FRONT_SHARE:
            first = rng.randint(1, FRONT - count + 1)
            return [f"A-{n}" for n in range(first, first + count)]
        everything = [s.label for s in seating.parse_ranges(SEATS, PRICES)]
        return sorted(rng.sample(everything, count), key=seat_order)
    best = sorted(free, key=seat_order)[: count * 3]
    return sorted(rng.sample(best, count), key=seat_order) if len(best) >= count else []


def waves_of(buyers: Sequence[Any]) -> list[list[Any]]:
    """The buyers split into :data:`WAVES` (every wave gets some while there are buyers)."""
    return [list(buyers[n :: len(WAVES)]) for n in range(len(WAVES))]


def merge(into: Invariants, found: Invariants) -> None:
    """Add the offenders of ``found`` to those of ``into`` (each named once)."""
    for f in fields(Invariants):
        seen: list[int] = getattr(into, f.name)
        seen.extend(x for x in getattr(found, f.name) if x not in seen)


@dataclass
class Promises:
    """The invariants checked so far (the engine's and the tickets demo's own, by name, each
    with its offenders) and how many times."""

    engine: Invariants = field(default_factory=Invariants)
    tickets: dict[str, list[int]] = field(default_factory=dict)
    checks: int = 0

    def add(self, engine: Invariants, own: Mapping[str, Sequence[int]]) -> None:
        """One more check's findings."""
        merge(self.engine, engine)
        for name, offenders in own.items():
            seen = self.tickets.setdefault(name, [])
            seen.extend(x for x in offenders if x not in seen)
        self.checks += 1

    @property
    def ok(self) -> bool:
        """Every invariant held at every check."""
        return self.engine.ok and not any(self.tickets.values())

    def table(self) -> Table:
        """The engine's invariants table with the tickets ones below."""
        table = render.invariants_table(self.engine)
        for name, offenders in self.tickets.items():
            table.add_row(name, "[red]FAIL[/red] " + str(offenders[:10]) if offenders else "PASS")
        table.caption = f"checked {self.checks} times"
        return table


async def _ticket_promises(deps: Deps, show_id: int, *, over: bool) -> dict[str, list[int]]:
    """The tickets invariants beside :func:`report.check_invariants`, from the database; with
    ``over`` (the show cancelled and every order final) also that nothing of the show is left."""
    live = list(tickets.LIVE)
    dead = [s.value for s in CANCELLED_STATUSES]
    in_live = order_lines.join(t_orders, t_orders.c.id == order_lines.c.order_id)
    twice = (
        select(order_lines.c.item_id)
        .select_from(in_live)
        .where(order_lines.c.kind == "seat", t_orders.c.status.in_(live))
        .group_by(order_lines.c.item_id)
        .having(func.count(order_lines.c.order_id.distinct()) > 1)
    )
    expected = case((t_orders.c.status == OrderStatus.PAID.value, shows.SOLD), else_=shows.HELD)
    held = (
        select(seat_holds.c.order_id, func.count().label("n"))
        .join(t_orders, t_orders.c.id == seat_holds.c.order_id)
        .where(seat_holds.c.state == expected)
        .group_by(seat_holds.c.order_id)
        .subquery()
    )
    lines = (
        select(order_lines.c.order_id, func.count().label("n"))
        .where(order_lines.c.kind == "seat")
        .group_by(order_lines.c.order_id)
        .subquery()
    )
    missing = (
        select(t_orders.c.id)
        .join(lines, lines.c.order_id == t_orders.c.id)
        .outerjoin(held, held.c.order_id == t_orders.c.id)
        .where(t_orders.c.status.in_(live), func.coalesce(held.c.n, 0) != lines.c.n)
    )
    unrefunded = (
        select(payments.c.order_id)
        .join(t_orders, t_orders.c.id == payments.c.order_id)
        .outerjoin(refunds, refunds.c.payment_id == payments.c.id)
        .where(payments.c.state == "paid", t_orders.c.status.in_(dead), refunds.c.id.is_(None))
    )
    async with deps.db.report() as conn:
        found = {
            "no seat in the lines of two live orders": twice,
            "every live order holds all its seats": missing,
            REFUND_NAME: unrefunded,
        }
        result = {name: list((await conn.execute(q)).scalars()) for name, q in found.items()}
        if over:
            kept = select(seat_holds.c.seat_id).where(seat_holds.c.show_id == show_id)
            valid = select(t_tickets.c.seat_id).where(
                t_tickets.c.show_id == show_id, t_tickets.c.state == shows.VALID
            )
            result["the cancelled show: every seat free, every ticket void"] = list(
                (await conn.execute(kept.union(valid))).scalars()
            )
    return result


class Rush(ABC):
    """Buyers at the box office of one show, in process or over HTTP: who placed what, and
    each order's habit (kept in :attr:`people`)."""

    rng: random.Random
    people: dict[int, marketplace.Person]
    #: The habits orders are given (:data:`dueflow.demo.marketplace.BUYER_HABITS` or the HTTP
    #: ones).
    habits: Mapping[str, float]

    @abstractmethod
    async def place(self, buyer: Any, labels: list[str]) -> dict[str, Any] | str:
        """Order these seats for ``buyer``: the new order's view, or the refusal's code (each
        refusal counted by its code)."""

    @abstractmethod
    async def free_seats(self) -> list[str]:
        """The labels of the free seats on the seat map."""

    @abstractmethod
    async def pay_window(self, order: dict[str, Any], habit: str, buyer: Any) -> None:
        """What the buyer does in the order's pay window by ``habit``."""

    async def rush(self, buyer: Any, greedy: bool) -> None:
        """One buyer: one order (again with the best seats left when the first choice was
        taken), or two at once when ``greedy``; then each order's pay window by habit."""
        rng = self.rng
        if greedy:
            wanted = [pick_seats(rng, 3), pick_seats(rng, 3)]
            placed = list(await asyncio.gather(*(self.place(buyer, w) for w in wanted)))
        else:
            count = rng.randint(1, 3)
            placed = [await self.place(buyer, pick_seats(rng, count))]
            if placed[0] == "seat_unavailable":
                again = pick_seats(rng, count, await self.free_seats())
                if again:
                    placed = [await self.place(buyer, again)]
        habit = marketplace.pick_habit(rng, dict(self.habits))
        orders = [order for order in placed if not isinstance(order, str)]
        for order in orders:
            self.people[order["id"]] = marketplace.Person(habit, "-", False, False, False)
        await asyncio.gather(*(self.pay_window(order, habit, buyer) for order in orders))


class BoxOffice(marketplace.Market, Rush):
    """The buyers of one show, placing, paying and cancelling in process."""

    habits = marketplace.BUYER_HABITS

    def __init__(
        self, deps: Deps, rng: random.Random, sim: httpx.AsyncClient, show_id: int
    ) -> None:
        super().__init__(deps, rng, sim)
        self.show_id = show_id
        self.people = {}

    async def place(self, buyer: Any, labels: list[str]) -> dict[str, Any] | str:
        try:
            return await tickets.place_ticket_order(
                self.deps, buyer_id=buyer, show_id=self.show_id, labels=labels
            )
        except DueflowError as exc:
            self.refused[f"order ({exc.code})"] += 1
            return exc.code

    async def free_seats(self) -> list[str]:
        seat_map = await tickets.seat_map(self.deps, self.show_id)
        return [s["label"] for s in seat_map if s["state"] == shows.FREE]

    async def pay_window(self, order: dict[str, Any], habit: str, buyer: Any) -> None:
        pay = order["pay_deadline"] - order["created_at"]
        await self.pay_by_habit(order, habit, buyer, pay)


async def run(
    *, buyers: int, speed: float, db: Path | None, seed: int, live: bool, console: Console
) -> bool:
    """Run the sale; True when every invariant held at every check."""
    async with marketplace.fast_world(speed=speed, db=db) as world:
        deps = world.deps
        rng = random.Random(seed)
        organizer = (await accounts.add_user(deps, "organizer"))[0].id
        people = [(await accounts.add_user(deps, f"buyer{i}"))[0].id for i in range(buyers)]
        latecomers = [(await accounts.add_user(deps, f"late{i}"))[0].id for i in range(LATECOMERS)]
        now = deps.clock.now()
        show_id = await tickets.create_show(
            deps,
            organizer_id=organizer,
            title="Winter concert",
            venue="Hall 1",
            starts_at=now + timedelta(days=2),
            sales_close_at=now + timedelta(days=1),
            seat_limit=SEAT_LIMIT,
            seats=seating.parse_ranges(SEATS, PRICES),
        )
        pay = deps.policy.durations(tickets.TICKET_ORDER_TYPE).pay
        console.print(
            f"dueflow demo --flow tickets: {buyers} buyers in {len(WAVES)} waves for "
            f"{len(seating.parse_ranges(SEATS, PRICES))} seats (limit {SEAT_LIMIT} a buyer), dev "
            f"profile at {speed:g}x (pay {pay}); the organizer cancels the show at "
            f"{SHOW_CANCEL_AT:g} pay windows"
        )
        office = BoxOffice(deps, rng, world.sim, show_id)
        promises, figures = Promises(), Table("measure", "value", title="the sale")
        async with (
            marketplace.worker_running(deps),
            marketplace.watching(
                lambda: _check(deps, show_id, promises, speed, over=False), CHECK_EVERY
            ),
        ):
            tasks = await _sell(office, organizer, people, latecomers, pay, figures)
            with marketplace.live_view(console, live) as view:
                await marketplace.wait_until_settled(deps, tasks, view)
        return await _summarise(deps, world.notifier, office, promises, figures, console, speed)


async def _check(deps: Deps, show_id: int, promises: Promises, speed: float, *, over: bool) -> None:
    """One check of the invariants into ``promises``: the engine's, then the tickets ones (with
    ``over``, those of the sale's end too)."""
    engine = await marketplace.engine_invariants(deps, speed)
    promises.add(engine, await _ticket_promises(deps, show_id, over=over))


async def _sell(
    office: BoxOffice,
    organizer: int,
    people: list[int],
    latecomers: list[int],
    pay: timedelta,
    figures: Table,
) -> list[asyncio.Task[None]]:
    """The waves, the organizer's cancel and the latecomers, on time; the buyers' tasks."""
    deps, rng = office.deps, office.rng
    start = deps.clock.now()
    tasks: list[asyncio.Task[None]] = []
    for at, wave in zip(WAVES, waves_of(people), strict=True):
        await office.at(start, at, pay)
        rushes = [office.rush(buyer, rng.random() < GREEDY) for buyer in wave]
        tasks.append(asyncio.create_task(together(rushes)))
    await office.at(start, SHOW_CANCEL_AT, pay)
    seats = (await tickets.show_view(deps, office.show_id))["seats"]
    cancelled = await tickets.cancel_show(deps, show_id=office.show_id, user_id=organizer)
    figures.add_row("seats at the show cancel", ", ".join(f"{s} {n}" for s, n in seats.items()))
    figures.add_row("orders the show cancel cancels", str(cancelled))
    await office.at(start, LATECOMERS_AT, pay)
    tasks.append(asyncio.create_task(together([office.rush(b, False) for b in latecomers])))
    return tasks


async def together(rushes: Sequence[Awaitable[None]]) -> None:
    """Buyers at the same moment."""
    await asyncio.gather(*rushes)


async def _summarise(
    deps: Deps,
    notifier: LogNotifier,
    office: BoxOffice,
    promises: Promises,
    figures: Table,
    console: Console,
    speed: float,
) -> bool:
    console.print(marketplace.outcomes_table(await office.finals(office.people), paying=()))
    figures.add_row("orders placed", str(len(office.people)))
    console.print(figures)
    console.print(await marketplace.figures_table(deps, notifier, office.refused, speed))
    await _check(deps, office.show_id, promises, speed, over=True)
    console.print(promises.table())
    return marketplace.verdict(console, promises.ok)
