"""``dueflow demo --url``: the demo's simulated people against a running ``dueflow serve``.

The server must run the dev profile with its payment simulator mounted at ``/sim``. Everything
goes over HTTP with bearer tokens: users are made through the admin API, goods and orders by the
sellers and buyers themselves, payments through the simulator's control API (scan, then pay).

Time is the server's and it runs at its own pace: every wait is a fraction of a window read from
the order views (``pay_deadline - created_at``, ``ship_deadline - paid_at``, ...), never from a
policy, slept in real time (corrected for the offset between this clock and the server's).

The habits are :mod:`dueflow.demo.marketplace`'s with one exception. ``pays_late`` (a bank transfer
recorded after the order was cancelled) has no HTTP route, so over HTTP it becomes
``pays_on_cancel``: the buyer opens the pay page and presses cancel while paying on the phone (the
simulator's ``/control/pay-on-close``). The cancel closes the trade first, the close loses,
close-or-query finds the payment, the cancel is refused (``cancel while paying
(invalid_transition)``) and the order goes on to its seller.

The live view polls ``GET /api/admin/summary`` (the whole server); the run ends when every
simulated person is done and no order of this run is in a live status. The figures and the
invariants come from the summary, the outcomes from the run's order views.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections import Counter
from collections.abc import Awaitable, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from dueflow import render

# The server as the HTTP demos see it, re-exported (``demo_http.Server``, ``demo_http.connected``).
from dueflow.demo._http_server import BadServer as BadServer
from dueflow.demo._http_server import Refused as Refused
from dueflow.demo._http_server import Server as Server
from dueflow.demo._http_server import ServerLost as ServerLost
from dueflow.demo._http_server import Stale as Stale
from dueflow.demo._http_server import add_user as add_user
from dueflow.demo._http_server import connected as connected
from dueflow.demo._http_server import dates_of as dates_of
from dueflow.demo._http_server import gather_views as gather_views
from dueflow.demo._http_server import invariants_of as invariants_of
from dueflow.demo._http_server import refusal as refusal
from dueflow.demo._http_server import snapshot
from dueflow.demo.marketplace import (
    BUYER_HABITS,
    PAYING,
    Person,
    live_view,
    outcomes_table,
    pick_person,
    watching,
)
from dueflow.demo.tickets import Promises
from dueflow.domain.lifecycle import FINAL_STATUSES
from dueflow.service import payments

#: :data:`dueflow.demo.marketplace.BUYER_HABITS` with ``pays_late`` replaced (see the module
#: docstring).
HTTP_BUYER_HABITS = {
    ("pays_on_cancel" if habit == "pays_late" else habit): weight
    for habit, weight in BUYER_HABITS.items()
}
HTTP_PAYING = (*PAYING, "pays_on_cancel")
FINAL = tuple(sorted(s.value for s in FINAL_STATUSES))
#: The deadline an order in each live status waits for.
DEADLINE_OF = {
    "pending_payment": "pay_deadline",
    "pending_shipment": "ship_deadline",
    "shipped": "receive_deadline",
    "received": "review_deadline",
}
#: How long past its deadline a live order may stay before the demo stops waiting for it.
GIVE_UP = timedelta(minutes=2)
SELLERS, BUYERS = 3, 10
POLL = 0.5
#: The server refuses to start a payment this close to the pay deadline (plus a little for
#: the clock offset and the request's own time).
EXPIRY_MARGIN = payments.MIN_PAY_WINDOW + timedelta(seconds=0.5)


def _window(view: Mapping[str, Any], start: str, end: str) -> timedelta:
    """The time from one field of an order view to another (never negative)."""
    window: timedelta = view[end] - view[start]
    return max(window, timedelta(0))


def _before_expiry(fraction: float, pay: timedelta) -> float:
    """``fraction`` of the pay window, but at least :data:`EXPIRY_MARGIN` before its end (the
    server refuses payments started later)."""
    latest = 1 - EXPIRY_MARGIN / pay if pay > timedelta(0) else fraction
    return max(0.0, min(fraction, latest))


def _poll_every(window: timedelta) -> float:
    return min(2.0, max(0.2, window.total_seconds() / 20))


class HttpMarket:
    """The simulated people, one per order, acting through the API."""

    def __init__(self, server: Server, rng: random.Random) -> None:
        self.server = server
        self.rng = rng
        self.refused: Counter[str] = Counter()

    async def at(self, start: datetime, fraction: float, window: timedelta) -> None:
        """Wait until ``fraction`` of ``window`` has passed since ``start`` (server time)."""
        await self.server.sleep_until(start + window * fraction)

    async def act(self, what: str, call: Awaitable[Any]) -> bool:
        """Do something a person does; a refusal is counted by its error code."""
        try:
            await call
        except Refused as exc:
            self.refused[f"{what} ({exc.code})"] += 1
            return False
        return True

    async def start_paying(self, order_id: int, buyer: str) -> dict[str, Any]:
        """Start a payment through a random provider and open the pay page (scan)."""
        provider = self.rng.choice(["alipay", "wechatpay"])
        started = await self.server.call(
            "POST", f"/api/orders/{order_id}/payments", buyer, {"provider": provider}
        )
        trade = {"provider": provider, "out_trade_no": started["pay_no"]}
        await self.server.call("POST", "/sim/control/scan", body=trade)
        return trade

    async def pay_online(self, order_id: int, buyer: str, delay: float) -> None:
        """Pay; the notification comes ``delay`` seconds later."""
        trade = await self.start_paying(order_id, buyer)
        await self.server.call("POST", "/sim/control/pay", body={**trade, "delay": delay})

    async def pay_on_cancel(self, order_id: int, buyer: str) -> None:
        """Pay just as the cancel closes the trade: the close loses."""
        trade = await self.start_paying(order_id, buyer)
        await self.server.call("POST", "/sim/control/pay-on-close", body=trade)

    async def left(self, order_id: int, status: str, window: timedelta) -> dict[str, Any]:
        """The order's view once it has left ``status`` (paid, received ...); :class:`Stale`
        when it is still there :data:`GIVE_UP` past its deadline (a stalled server)."""
        while True:
            view = await self.server.view(order_id)
            if view["status"] != status:
                return view
            deadline = view.get(DEADLINE_OF.get(status, ""))
            if deadline is not None and self.server.now() > deadline + GIVE_UP:
                raise Stale(f"order {order_id} is still {status} past its deadline")
            await asyncio.sleep(_poll_every(window))

    async def life(self, order_id: int, person: Person, buyer: str, seller: str) -> None:
        try:
            await self._life(order_id, person, buyer, seller)
        except (httpx.HTTPError, Refused, Stale, KeyError, TypeError, ValueError) as exc:
            # a server that stalls or answers out of shape ends this person, not the demo
            self.refused[f"gave up ({type(exc).__name__})"] += 1

    async def pay_by_habit(self, order: Mapping[str, Any], habit: str, buyer: str) -> bool:
        """The buyer's part of the order's pay window by ``habit`` (one of
        :data:`HTTP_BUYER_HABITS`); True when the buyer paid (the order goes on)."""
        rng, server, order_id = self.rng, self.server, order["id"]
        pay = _window(order, "created_at", "pay_deadline")
        path = f"/api/orders/{order_id}"
        if habit == "never_pays":
            return False
        if habit == "cancels":
            await self.at(order["created_at"], rng.uniform(0.1, 0.8), pay)
            await self.act("cancel", server.call("POST", f"{path}/cancel", buyer))
            return False
        if habit == "pays_on_cancel":
            await self.at(order["created_at"], _before_expiry(rng.uniform(0.3, 0.7), pay), pay)
            if not await self.act("payment", self.pay_on_cancel(order_id, buyer)):
                return False
            await self.act("cancel while paying", server.call("POST", f"{path}/cancel", buyer))
            return True
        wire = habit == "pays_at_the_wire"
        paying_at = _before_expiry(0.8 if wire else rng.uniform(0.1, 0.7), pay)
        await self.at(order["created_at"], paying_at, pay)
        # at the wire: the notification comes at 1.2 of the window, past the deadline
        delay = pay.total_seconds() * (1.2 - paying_at) if wire else 0.0
        return await self.act("payment", self.pay_online(order_id, buyer, delay))

    async def _life(self, order_id: int, person: Person, buyer: str, seller: str) -> None:
        rng, server = self.rng, self.server
        order = await server.view(order_id)
        path = f"/api/orders/{order_id}"
        if not await self.pay_by_habit(order, person.buyer, buyer):
            return
        if person.seller == "never_ships":
            return
        pay = _window(order, "created_at", "pay_deadline")
        paid = await self.left(order_id, "pending_payment", pay)
        if paid["paid_at"] is None:
            return
        ship_late = person.seller == "ships_late"
        await self.at(
            paid["paid_at"],
            rng.uniform(1.1, 1.3) if ship_late else rng.uniform(0.1, 0.8),
            _window(paid, "paid_at", "ship_deadline"),
        )
        shipment = {"carrier": "SF", "tracking_no": f"SF{order_id:08d}"}
        shipped = await self.act(
            "late shipping" if ship_late else "shipping",
            server.call("POST", f"{path}/ship", seller, shipment),
        )
        if not shipped:
            return
        shipped_view = await server.view(order_id)
        receive = _window(shipped_view, "shipped_at", "receive_deadline")
        if person.confirms:
            await self.at(shipped_view["shipped_at"], rng.uniform(0.1, 0.8), receive)
            await self.act("confirm", server.call("POST", f"{path}/confirm-receipt", buyer))
        else:  # left to the confirm_receipt timer
            await self.at(shipped_view["receive_deadline"], 0.0, receive)
        received = await self.left(order_id, "shipped", receive)
        if received["received_at"] is None:
            return
        review = _window(received, "received_at", "review_deadline")
        for reviews, token in ((person.buyer_reviews, buyer), (person.seller_reviews, seller)):
            if reviews:
                await self.at(received["received_at"], rng.uniform(0.1, 0.5), review)
                rating = {"rating": rng.randint(3, 5)}
                await self.act("review", server.call("POST", f"{path}/reviews", token, rating))


async def run(
    *, url: str, admin_token: str, orders: int, seed: int, live: bool, console: Console
) -> bool:
    """Run the simulation against the server at ``url``; True when every invariant holds.

    Raises:
        BadServer: ``url`` is not a usable dueflow server, or the token is not an admin's.
        ServerLost: the server stopped answering during the run.
    """
    async with connected(url, admin_token) as server:
        return await _simulate(
            server, url.rstrip("/"), count=orders, seed=seed, live=live, console=console
        )


async def _simulate(
    server: Server, url: str, *, count: int, seed: int, live: bool, console: Console
) -> bool:
    rng = random.Random(seed)
    run_id = secrets.token_hex(3)  # names unused by earlier runs against the same server
    sellers = [await add_user(server, f"seller{i}-{run_id}") for i in range(SELLERS)]
    buyers = [await add_user(server, f"buyer{i}-{run_id}") for i in range(BUYERS)]
    market = HttpMarket(server, rng)
    habits: dict[int, Person] = {}
    tasks: list[asyncio.Task[None]] = []
    for n in range(count):
        seller, buyer = sellers[n % len(sellers)], rng.choice(buyers)
        price = f"{rng.randint(5, 500)}.{rng.randint(0, 99):02d}"
        goods = await server.call(
            "POST", "/api/goods", seller, {"title": f"item {n}", "price": price}
        )
        person = pick_person(rng, HTTP_BUYER_HABITS)
        order = dates_of(await server.call("POST", "/api/orders", buyer, {"goods_id": goods["id"]}))
        pay = _window(order, "created_at", "pay_deadline")
        if n == 0:
            console.print(
                f"dueflow demo over HTTP: {count} orders, {len(buyers)} buyers, {len(sellers)} "
                f"sellers (run {run_id}) against {url} in its own time (pay within "
                f"{pay.total_seconds():g} s)"
            )
        habits[order["id"]] = person
        tasks.append(asyncio.create_task(market.life(order["id"], person, buyer, seller)))
        await asyncio.sleep(rng.uniform(0, 1.0 / count) * pay.total_seconds())
    with live_view(console, live) as view:
        gave_up = await wait_until_settled(server, habits, tasks, view)
    await asyncio.gather(*tasks)
    if gave_up:
        console.print(
            f"[red]stopped waiting for orders {sorted(gave_up)[:10]}: live "
            f"{GIVE_UP.total_seconds():g} s past their deadline[/red]"
        )
    return await _summarise(server, market, habits, console)


def invariants_watched(server: Server, promises: Promises) -> AbstractAsyncContextManager[None]:
    """While inside, the server's invariants (its admin summary's) checked into ``promises``
    every :data:`POLL` seconds."""

    async def check() -> None:
        promises.add(invariants_of(await server.summary()), {})

    return watching(check, POLL)


async def wait_until_settled(
    server: Server,
    habits: Mapping[int, Person],
    tasks: list[asyncio.Task[None]],
    live: Live | None,
) -> set[int]:
    """Wait until every person is done and no order of the run (``habits``) is live; the orders
    given up on (live long past their deadline)."""
    pending = sorted(habits)
    while True:
        acting = sum(not t.done() for t in tasks)
        if acting == 0:
            views = await gather_views(server, pending)
            pending = [v["id"] for v in views if v["status"] not in FINAL]
            stale = {
                v["id"]
                for v in views
                if v["status"] in DEADLINE_OF
                and v[DEADLINE_OF[v["status"]]] is not None
                and server.now() > v[DEADLINE_OF[v["status"]]] + GIVE_UP
            }
            if not pending or set(pending) <= stale:
                return set(pending)
        if live is not None:
            table = render.snapshot_table(
                snapshot(await server.summary()), title="dueflow demo over HTTP (live, server)"
            )
            table.add_row("this run: people acting", f"{acting} / {len(tasks)}")
            if acting == 0:
                table.add_row("this run: orders live", str(len(pending)))
            live.update(table)
        await asyncio.sleep(POLL)


def add_server_rows(table: Table, summary: Mapping[str, Any], refused: Counter[str]) -> None:
    """The rows every HTTP demo's figures end with: the refunds awaiting review and the
    discrepancies of the admin summary (the whole server's), and the run's refused actions."""
    table.add_row(
        "refunds awaiting review (server)", str(summary["refunds"].get("pending_review", 0))
    )
    table.add_row("discrepancies (server)", str(summary["discrepancies"]))
    table.add_row(
        "actions refused", ", ".join(f"{k} {v}" for k, v in sorted(refused.items())) or "none"
    )


async def _summarise(
    server: Server, market: HttpMarket, habits: Mapping[int, Person], console: Console
) -> bool:
    views = {v["id"]: v for v in await gather_views(server, sorted(habits))}
    console.print(
        outcomes_table(
            ((person, views[order_id]["status"]) for order_id, person in habits.items()),
            HTTP_PAYING,
        )
    )
    summary = await server.summary()
    stats = Table("measure", "value", title="figures")
    for item in summary["lateness_last_hour"]:
        stats.add_row(
            f"timer lateness {item['kind']} (server, last hour)",
            f"p50 {item['p50'] * 1000:.0f} / p99 {item['p99'] * 1000:.0f} / max "
            f"{item['max'] * 1000:.0f} ms of {item['count']}",
        )
    reminders = sum(
        1
        for v in views.values()
        for t in v["timers"]
        if t["kind"] == "pay_reminder" and t["outcome"] == "sent"
    )
    stats.add_row("reminders sent (this run)", str(reminders))
    refunds = Counter(r["state"] for v in views.values() for r in v["refunds"])
    stats.add_row(
        "refunds (this run)", ", ".join(f"{s} {n}" for s, n in sorted(refunds.items())) or "none"
    )
    add_server_rows(stats, summary, market.refused)
    console.print(stats)
    inv = invariants_of(summary)
    console.print(render.invariants_table(inv))
    ok = bool(summary["invariants"].get("ok")) and inv.ok
    if ok:
        console.print("[green]all invariants hold[/green]")
    else:
        by_order = (inv.past_deadline, inv.reminders_twice, inv.reviews_twice)
        offenders = {order_id for ids in by_order for order_id in ids}
        console.print(
            "[red]invariants broken[/red] (the checks cover the whole server; offenders that "
            f"are orders of this run: {sorted(offenders & set(habits)) or 'none'})"
        )
    return ok
