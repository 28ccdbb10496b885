"""``dueflow demo``: a simulated second-hand marketplace on the dev profile, in fast time.

Buyers pay in time, pay late, never pay or cancel; sellers ship, ship late or never; some buyers
confirm receipt and review, the rest are left to the timers. A worker and a scanner run beside
them. At the end: outcomes per behaviour, timer lateness, and the invariants checked against the
database.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
)
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from dueflow import render

# The world in fast time, re-exported (``marketplace.fast_world``, ``marketplace.worker_running``).
from dueflow.demo._world import FastWorld as FastWorld
from dueflow.demo._world import fast_world as fast_world
from dueflow.demo._world import worker_running as worker_running
from dueflow.domain.lifecycle import OrderStatus
from dueflow.exceptions import DueflowError
from dueflow.notifiers.log import LogNotifier
from dueflow.service import accounts, orders, payments, report
from dueflow.service.deps import Deps
from dueflow.service.operations import percentile
from dueflow.service.report import Invariants

# pays: through the simulated Alipay or WeChat Pay; pays_at_the_wire: pays just before the
# deadline with the notification delayed past it (close-or-query finds the payment); pays_late:
# a bank transfer recorded after the order was cancelled (a discrepancy and a refund).
BUYER_HABITS = {
    "pays": 0.5,
    "pays_at_the_wire": 0.07,
    "pays_late": 0.07,
    "never_pays": 0.19,
    "cancels": 0.17,
}
SELLER_HABITS = {"ships": 0.75, "ships_late": 0.1, "never_ships": 0.15}
#: The buyer habits whose orders reach the seller.
PAYING = ("pays", "pays_at_the_wire")


@dataclass
class Person:
    """One simulated order's buyer and seller habits."""

    buyer: str
    seller: str
    confirms: bool
    buyer_reviews: bool
    seller_reviews: bool


def pick_habit(rng: random.Random, habits: dict[str, float]) -> str:
    return rng.choices(list(habits), weights=list(habits.values()))[0]


def pick_person(rng: random.Random, buyer_habits: dict[str, float] = BUYER_HABITS) -> Person:
    """A marketplace order's people: a buyer's and a seller's habit; half the buyers confirm
    receipt, some buyers and sellers review."""
    return Person(
        pick_habit(rng, buyer_habits),
        pick_habit(rng, SELLER_HABITS),
        rng.random() < 0.5,
        rng.random() < 0.4,
        rng.random() < 0.3,
    )


class Market:
    """The simulated people acting on one order each."""

    def __init__(self, deps: Deps, rng: random.Random, sim: httpx.AsyncClient) -> None:
        self.deps = deps
        self.rng = rng
        self.sim = sim
        self.refused: Counter[str] = Counter()
        self.outcomes: dict[int, str] = {}

    async def at(self, start: datetime, fraction: float, duration: timedelta) -> None:
        """Wait until ``fraction`` of ``duration`` has passed since ``start``."""
        await self.deps.clock.sleep_until(start + duration * fraction)

    async def view(self, order_id: int) -> dict[str, Any]:
        return await orders.order_view(self.deps, order_id)

    async def finals(self, people: Mapping[int, Person]) -> list[tuple[Person, str]]:
        """Each order's people (``people``: by order id) with the order's status now, its final
        one once the run has settled."""
        return [
            (person, (await self.view(order_id))["status"]) for order_id, person in people.items()
        ]

    async def act(self, what: str, action: object) -> bool:
        try:
            await action  # type: ignore[misc]
        except DueflowError as exc:
            self.refused[f"{what} ({exc.code})"] += 1
            return False
        return True

    async def pay_online(self, order_id: int, buyer_id: int, delay: float) -> None:
        """Start a payment, open the pay page (scan) and pay; the notification comes after
        ``delay`` simulated seconds."""
        provider = self.rng.choice(["alipay", "wechatpay"])
        pay_no, _ = await payments.start_payment(
            self.deps, order_id=order_id, user_id=buyer_id, provider=provider
        )
        trade = {"provider": provider, "out_trade_no": pay_no}
        await self.sim.post("/control/scan", json=trade)
        await self.sim.post("/control/pay", json={**trade, "delay": delay})

    async def paid_at(self, order_id: int) -> datetime | None:
        """When the order was paid, waiting for the notification (or for close-or-query at the
        deadline) to tell dueflow; None if it was not."""
        clock = self.deps.clock
        while True:
            view = await self.view(order_id)
            if view["status"] != "pending_payment":
                return view["paid_at"]  # type: ignore[no-any-return]
            await clock.sleep_until(clock.now() + timedelta(seconds=10))

    async def pay_by_habit(
        self, order: Mapping[str, Any], habit: str, buyer_id: int, pay: timedelta
    ) -> bool:
        """The buyer's part of the order's pay window ``pay``, by ``habit`` (one of
        :data:`BUYER_HABITS`); True when the buyer paid online (the order goes on)."""
        deps, rng, order_id = self.deps, self.rng, order["id"]
        if habit == "never_pays":
            return False
        if habit == "cancels":
            await self.at(order["created_at"], rng.uniform(0.1, 0.8), pay)
            await self.act(
                "cancel", orders.cancel_by_buyer(deps, order_id=order_id, user_id=buyer_id)
            )
            return False
        if habit == "pays_late":
            await self.at(order["created_at"], rng.uniform(1.6, 2.0), pay)
            await self.act(
                "late payment",
                payments.record_manual_payment(deps, order_id=order_id, amount=order["amount"]),
            )
            return False
        wire = habit == "pays_at_the_wire"
        await self.at(order["created_at"], 0.8 if wire else rng.uniform(0.1, 0.7), pay)
        delay = pay.total_seconds() * 0.4 if wire else 0.0
        await self.act("payment", self.pay_online(order_id, buyer_id, delay))
        return True

    async def life(self, order_id: int, person: Person, buyer_id: int, seller_id: int) -> None:
        deps, rng = self.deps, self.rng
        durations = deps.policy.durations("normal")
        order = await self.view(order_id)
        paid = await self.pay_by_habit(order, person.buyer, buyer_id, durations.pay)
        if not paid or person.seller == "never_ships":
            return
        ship_late = person.seller == "ships_late"
        paid_at = await self.paid_at(order_id)
        if paid_at is None:
            return
        await self.at(
            paid_at, rng.uniform(1.1, 1.3) if ship_late else rng.uniform(0.1, 0.8), durations.ship
        )
        shipped = await self.act(
            "late shipping" if ship_late else "shipping",
            orders.ship(
                deps,
                order_id=order_id,
                user_id=seller_id,
                carrier="SF",
                tracking_no=f"SF{order_id:08d}",
            ),
        )
        if not shipped:
            return
        shipped_view = await self.view(order_id)
        if person.confirms:
            await self.at(shipped_view["shipped_at"], rng.uniform(0.1, 0.8), durations.receive)
            await self.act(
                "confirm", orders.confirm_receipt(deps, order_id=order_id, user_id=buyer_id)
            )
        else:  # left to the confirm_receipt timer
            await self.at(shipped_view["receive_deadline"], 0.02, durations.receive)
        received_at = (await self.view(order_id))["received_at"] or shipped_view["receive_deadline"]
        for reviews, user_id in (
            (person.buyer_reviews, buyer_id),
            (person.seller_reviews, seller_id),
        ):
            if reviews:
                await self.at(received_at, rng.uniform(0.1, 0.5), durations.review)
                await self.act(
                    "review",
                    orders.review(
                        deps, order_id=order_id, user_id=user_id, rating=rng.randint(3, 5)
                    ),
                )


def outcomes_table(finals: Iterable[tuple[Person, str]], paying: Collection[str] = PAYING) -> Table:
    """Final statuses by buyer and seller habit; a seller's habit shows only for the buyers in
    ``paying`` (the others' orders never reach the seller), and not at all without ``paying``
    (a flow without sellers' habits)."""
    sellers = ("seller",) if paying else ()
    table = Table("buyer", *sellers, "orders", "final statuses", title="outcomes")
    by_habit: dict[tuple[str, str], Counter[str]] = {}
    for person, status in finals:
        seller = person.seller if person.buyer in paying else "-"
        by_habit.setdefault((person.buyer, seller), Counter())[status] += 1
    for (buyer, seller), counts in sorted(by_habit.items()):
        table.add_row(
            buyer,
            *((seller,) if paying else ()),
            str(sum(counts.values())),
            ", ".join(f"{s} {n}" for s, n in counts.most_common()),
        )
    return table


@contextlib.contextmanager
def live_view(console: Console, live: bool) -> Iterator[Live | None]:
    """A live view on ``console`` (redrawn four times a second, left on screen at the end) when
    ``live``; None when not."""
    if not live:
        yield None
        return
    with Live(console=console, refresh_per_second=4, transient=False) as view:
        yield view


@contextlib.asynccontextmanager
async def watching(check: Callable[[], Awaitable[None]], every: float) -> AsyncIterator[None]:
    """Run ``check()`` at once and then every ``every`` real seconds while inside; on the way
    out, let a check under way end."""
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            await check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every)

    watcher = asyncio.create_task(watch())
    # Not in a finally: an error inside ends the demo as it comes, the watcher left behind.
    yield
    stop.set()
    await watcher


def verdict(console: Console, ok: bool) -> bool:
    """Say whether every invariant held; ``ok`` again."""
    console.print("[green]all invariants hold[/green]" if ok else "[red]invariants broken[/red]")
    return ok


async def wait_until_settled(
    deps: Deps, tasks: list[asyncio.Task[None]], live: Live | None
) -> None:
    """Wait until every simulated person is done and no order is left in a live status,
    updating ``live`` (if any) with the snapshot."""
    while True:
        snap = await report.snapshot(deps)
        if live is not None:
            live.update(render.snapshot_table(snap, title="dueflow demo (live)"))
        pending = sum(n for s, n in snap.orders.items() if not OrderStatus(s).is_final)
        if pending == 0 and all(t.done() for t in tasks):
            return
        await asyncio.sleep(0.2)


async def run(
    *, orders: int, speed: float, db: Path | None, seed: int, live: bool, console: Console
) -> bool:
    """Run the simulation; True when every invariant holds."""
    async with fast_world(speed=speed, db=db) as world:
        return await _simulate(
            world.deps,
            world.notifier,
            world.sim,
            count=orders,
            seed=seed,
            live=live,
            console=console,
            speed=speed,
        )


async def _simulate(
    deps: Deps,
    notifier: LogNotifier,
    sim: httpx.AsyncClient,
    *,
    count: int,
    seed: int,
    live: bool,
    console: Console,
    speed: float,
) -> bool:
    rng = random.Random(seed)
    sellers = [(await accounts.add_user(deps, f"seller{i}"))[0] for i in range(3)]
    buyers = [(await accounts.add_user(deps, f"buyer{i}"))[0] for i in range(10)]
    console.print(
        f"dueflow demo: {count} orders, {len(buyers)} buyers, {len(sellers)} sellers, "
        f"dev profile at {speed:g}x (pay {deps.policy.durations('normal').pay}, "
        f"ship {deps.policy.durations('normal').ship})"
    )
    async with worker_running(deps):
        market, habits = await _play(deps, rng, sim, sellers, buyers, count, live, console)
    return await _summarise(deps, notifier, market, habits, console, speed)


async def _play(
    deps: Deps,
    rng: random.Random,
    sim: httpx.AsyncClient,
    sellers: list[Any],
    buyers: list[Any],
    count: int,
    live: bool,
    console: Console,
) -> tuple[Market, dict[int, Person]]:
    market = Market(deps, rng, sim)
    habits: dict[int, Person] = {}
    tasks: list[asyncio.Task[None]] = []
    pay = deps.policy.durations("normal").pay
    for n in range(count):
        seller, buyer = sellers[n % len(sellers)], rng.choice(buyers)
        goods_id = await accounts.add_goods(
            deps,
            seller_id=seller.id,
            title=f"item {n}",
            price=f"{rng.randint(5, 500)}.{rng.randint(0, 99):02d}",
        )
        person = pick_person(rng)
        order_id = await orders.place_order(deps, buyer_id=buyer.id, goods_id=goods_id)
        habits[order_id] = person
        tasks.append(asyncio.create_task(market.life(order_id, person, buyer.id, seller.id)))
        await market.at(deps.clock.now(), rng.uniform(0, 1.0 / max(count, 1)), pay)
    with live_view(console, live) as view:
        await wait_until_settled(deps, tasks, view)
    return market, habits


async def _summarise(
    deps: Deps,
    notifier: LogNotifier,
    market: Market,
    habits: dict[int, Person],
    console: Console,
    speed: float,
) -> bool:
    console.print(outcomes_table(await market.finals(habits)))
    console.print(await figures_table(deps, notifier, market.refused, speed))
    inv = await engine_invariants(deps, speed)
    console.print(render.invariants_table(inv))
    return verdict(console, inv.ok)


def invariant_tolerance(speed: float) -> float:
    """Simulated seconds an order may stay past its deadline (two real seconds)."""
    return max(2.0, 2.0 * speed)


async def engine_invariants(deps: Deps, speed: float) -> Invariants:
    """The engine's invariants, read from the database, for a world in fast time at ``speed``
    (orders may stay :func:`invariant_tolerance` past their deadlines)."""
    return await report.check_invariants(deps, tolerance_seconds=invariant_tolerance(speed))


async def figures_table(
    deps: Deps, notifier: LogNotifier, refused: Counter[str], speed: float
) -> Table:
    """Timers and their lateness in real time, reminders, refunds, discrepancies and the
    refused actions by reason."""
    snap = await report.snapshot(deps)
    lateness = await report.lateness_seconds(deps)
    real = [x / speed * 1000 for x in lateness]
    stats = Table("measure", "value", title="figures")
    stats.add_row("timers fired on first attempt", str(len(real)))
    if real:
        stats.add_row(
            "lateness p50 / p99 / max (real ms)",
            f"{percentile(real, 50):.0f} / {percentile(real, 99):.0f} / {real[-1]:.0f}",
        )
    stats.add_row("reminders sent", str(notifier.sent))
    stats.add_row("refunds awaiting review", str(snap.refunds.get("pending_review", 0)))
    stats.add_row("discrepancies (paid after cancel)", str(snap.discrepancies))
    stats.add_row(
        "actions refused",
        ", ".join(f"{k} {v}" for k, v in sorted(refused.items())) or "none",
    )
    return stats
