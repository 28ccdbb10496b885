"""``dueflow demo --url ... --flow tickets``: :mod:`dueflow.demo.tickets`'s sale against a
running ``dueflow serve`` (dev profile, simulator at ``/sim``), over the HTTP API only.

The organizer puts the show on sale (``POST /api/shows``), buyers order seats (``POST
/api/orders`` with ``show_id`` and ``seats``), look at the seat map when refused, pay through the
simulator's control API and cancel; the organizer cancels the show (``POST
/api/shows/{id}/cancel``). Time is the server's: the waves are fractions of the pay window read
from the first order. The habits are :data:`dueflow.demo.http.HTTP_BUYER_HABITS` (no late bank
transfer over HTTP).

The invariants: the admin summary's (the whole server's, read from its database) polled during
the sale and at the end, and the run's own orders and seat map read through the API at the end.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.table import Table

from dueflow.demo import http as demo_http
from dueflow.demo import tickets as demo_tickets
from dueflow.demo.http import HttpMarket, Refused, Server
from dueflow.demo.marketplace import live_view, outcomes_table, verdict
from dueflow.demo.tickets import LATECOMERS, LATECOMERS_AT, PRICES, SEATS, SHOW_CANCEL_AT, WAVES
from dueflow.domain import seating
from dueflow.domain.lifecycle import CANCELLED_STATUSES

#: How long the sale waits for its first order (to learn the pay window).
FIRST_ORDER = 30.0


class HttpBoxOffice(HttpMarket, demo_tickets.Rush):
    """The buyers of one show, through the API."""

    habits = demo_http.HTTP_BUYER_HABITS

    def __init__(self, server: Server, rng: random.Random, show_id: int) -> None:
        super().__init__(server, rng)
        self.show_id = show_id
        self.people = {}
        self.first_order = asyncio.Event()
        self.pay = timedelta(0)

    async def place(self, buyer: Any, labels: list[str]) -> dict[str, Any] | str:
        body = {"show_id": self.show_id, "seats": labels}
        try:
            order = demo_http.dates_of(await self.server.call("POST", "/api/orders", buyer, body))
        except Refused as exc:
            self.refused[f"order ({exc.code})"] += 1
            return exc.code
        if not self.first_order.is_set():
            self.pay = order["pay_deadline"] - order["created_at"]
            self.first_order.set()
        return order

    async def free_seats(self) -> list[str]:
        answer = await self.server.call(
            "GET", f"/api/shows/{self.show_id}/seats", self.server.admin
        )
        return [s["label"] for s in answer["seats"] if s["state"] == "free"]

    async def pay_window(self, order: dict[str, Any], habit: str, buyer: Any) -> None:
        try:
            await self.pay_by_habit(order, habit, buyer)
        except (Refused, KeyError, TypeError, ValueError) as exc:
            self.refused[f"gave up ({type(exc).__name__})"] += 1


async def run(
    *, url: str, admin_token: str, buyers: int, seed: int, live: bool, console: Console
) -> bool:
    """Run the sale against the server at ``url``; True when every invariant held.

    Raises:
        BadServer, ServerLost: as :func:`dueflow.demo._http_server.connected` says.
    """
    async with demo_http.connected(url, admin_token) as server:
        rng = random.Random(seed)
        run_id = secrets.token_hex(3)
        organizer = await demo_http.add_user(server, f"organizer-{run_id}")
        people = [await demo_http.add_user(server, f"buyer{i}-{run_id}") for i in range(buyers)]
        late = [await demo_http.add_user(server, f"late{i}-{run_id}") for i in range(LATECOMERS)]
        show_id = await _create_show(server, organizer, run_id)
        console.print(
            f"dueflow demo --flow tickets over HTTP: {buyers} buyers in {len(WAVES)} waves for "
            f"show {show_id} (run {run_id}) against {url.rstrip('/')} in its own time; the "
            f"organizer cancels the show at {SHOW_CANCEL_AT:g} pay windows"
        )
        office = HttpBoxOffice(server, rng, show_id)
        promises = demo_tickets.Promises()
        async with demo_http.invariants_watched(server, promises):
            tasks = await _sell(office, organizer, people, late)
            with live_view(console, live) as view:
                await demo_http.wait_until_settled(server, office.people, tasks, view)
            await asyncio.gather(*tasks)
        return await _summarise(server, office, promises, console)


async def _create_show(server: Server, organizer: str, run_id: str) -> int:
    now = server.now()
    body = {
        "title": f"Winter concert {run_id}",
        "venue": "Hall 1",
        "starts_at": (now + timedelta(days=2)).isoformat(),
        "sales_close_at": (now + timedelta(days=1)).isoformat(),
        "seat_limit": demo_tickets.SEAT_LIMIT,
        "seats": [{"label": s.label, "price": str(s.price)} for s in _seats()],
    }
    show = await server.call("POST", "/api/shows", organizer, body)
    return int(show["id"])


def _seats() -> list[seating.SeatSpec]:
    return seating.parse_ranges(SEATS, PRICES)


async def _sell(
    office: HttpBoxOffice, organizer: str, people: list[str], latecomers: list[str]
) -> list[asyncio.Task[None]]:
    """The waves, the organizer's cancel and the latecomers, on the server's time."""
    rng, server = office.rng, office.server
    start = server.now()
    tasks: list[asyncio.Task[None]] = []
    for n, (at, wave) in enumerate(zip(WAVES, demo_tickets.waves_of(people), strict=True)):
        if n == 1:
            await asyncio.wait_for(office.first_order.wait(), FIRST_ORDER)
        await office.at(start, at, office.pay)
        rushes = [office.rush(buyer, rng.random() < demo_tickets.GREEDY) for buyer in wave]
        tasks.append(asyncio.create_task(demo_tickets.together(rushes)))
    await office.at(start, SHOW_CANCEL_AT, office.pay)
    await server.call("POST", f"/api/shows/{office.show_id}/cancel", organizer)
    await office.at(start, LATECOMERS_AT, office.pay)
    tasks.append(
        asyncio.create_task(demo_tickets.together([office.rush(b, False) for b in latecomers]))
    )
    return tasks


def _run_promises(views: Mapping[int, Mapping[str, Any]], seat_map: Any) -> dict[str, list[int]]:
    """The run's own promises from the API: every order ended cancelled, every paid one with a
    refund, no seat left held and no ticket valid."""
    dead = {s.value for s in CANCELLED_STATUSES}
    return {
        "every order of the cancelled show ended cancelled": [
            oid for oid, v in views.items() if v["status"] not in dead
        ],
        demo_tickets.REFUND_NAME: [
            oid
            for oid, v in views.items()
            if any(p["state"] == "paid" for p in v["payments"]) and not v["refunds"]
        ],
        "the cancelled show: every seat free, every ticket void": [
            oid for oid, v in views.items() if any(t["state"] != "void" for t in v["tickets"])
        ]
        # No order holds a seat (the map says not_for_sale, not free: the show sells no more).
        + [0 for s in seat_map["seats"] if s["state"] in ("held", "sold")][:1],
    }


async def _summarise(
    server: Server, office: HttpBoxOffice, promises: demo_tickets.Promises, console: Console
) -> bool:
    views = {v["id"]: v for v in await demo_http.gather_views(server, sorted(office.people))}
    console.print(
        outcomes_table(((p, views[oid]["status"]) for oid, p in office.people.items()), ())
    )
    summary = await server.summary()
    stats = Table("measure", "value", title="figures")
    stats.add_row("orders placed", str(len(office.people)))
    demo_http.add_server_rows(stats, summary, office.refused)
    console.print(stats)
    seat_map = await server.call("GET", f"/api/shows/{office.show_id}/seats", server.admin)
    promises.add(demo_http.invariants_of(summary), _run_promises(views, seat_map))
    console.print(promises.table())
    return verdict(console, promises.ok and bool(summary["invariants"].get("ok")))
