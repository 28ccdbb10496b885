"""The chaos soak's load generator (issue 14): simulated people placing, paying, cancelling,
shipping and reviewing orders of every flow against a fleet of ``dueflow serve`` API processes,
paying through an external payment simulator, while a chaos driver breaks things around them.

:func:`run_load` sets up its own users, goods, shows, SKUs, coupons and a flash sale, then starts
one *person* task per order at the plan's rate (Poisson arrivals, flows drawn evenly). Each
person follows a buyer habit (:data:`BUYER_HABITS`) and, once paid, a seller habit
(:data:`SELLER_HABITS`); an *operator* task approves most pending refunds and rejects a few.

Any API process may be down at any moment (restarted, killed): every API call is retried on the
next URL with a short backoff for :data:`RETRY_FOR` seconds in all (counted as ``retries``).
``POST /api/orders`` carries an ``Idempotency-Key``, so a repeat answers the first order; the
other actions are repeated as they are, since dueflow answers the repeat of a cancel, a ship, a
confirm or a review with a clear 409 (counted under ``refused``). A refusal is a normal outcome
for a person who acts late; an exception ends only its own person (counted under ``errors``).

Every wait is a fraction of a window read from the order views (``pay_deadline - created_at``,
``ship_deadline - paid_at`` ...), never a hard-coded duration; the fleet runs on this machine,
so the server's clock is this clock.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import re
import secrets
from collections import Counter
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx

from dueflow.demo.http import DEADLINE_OF, Refused, dates_of, refusal
from dueflow.domain.lifecycle import FINAL_STATUSES
from dueflow.service.payments import MIN_PAY_WINDOW

T = TypeVar("T")
ID = re.compile(r"/[0-9]+")

#: How often each buyer habit is drawn (weights).
BUYER_HABITS: dict[str, float] = {
    "pays": 4.0,  # pays promptly
    "pays_duplicate": 1.5,  # pays; the simulator sends the notification 2-4 times
    "pays_late": 1.0,  # pays; the notification is held until after the pay deadline
    "pays_after_close": 1.0,  # starts paying, pays only once the order was cancelled
    "pays_twice": 1.0,  # two payments (two providers), both paid: one must be refunded
    "pays_on_close": 1.0,  # pays just as the buyer's own cancel closes the trade
    "cancels": 1.0,  # cancels before paying
    "never_pays": 1.0,
}
#: How often each seller habit is drawn, for orders that wait to be shipped (weights).
SELLER_HABITS: dict[str, float] = {"ships": 6.0, "ships_late": 1.5, "never_ships": 1.0}
#: The three kinds of shop order, drawn evenly.
SHOP_KINDS = ("lines", "lines_coupon", "flash")
#: Statuses an order of this run may rest in: the final ones, and a paid ticket.
SETTLED = frozenset({s.value for s in FINAL_STATUSES} | {"paid"})

HTTP_TIMEOUT = 10.0
#: How long one API call is retried on the other URLs before the person gives up on it.
RETRY_FOR = 30.0
FIRST_PAUSE, LONGEST_PAUSE = 0.2, 2.0
#: At most this many people act at once; placing waits for a free place.
MAX_PERSONS = 300
#: One person's whole life, at most (seconds); the longest habit needs about two minutes.
PERSON_LIMIT = 240.0
#: How long after its deadline an order may stay where it is before its person stops waiting.
GIVE_UP = timedelta(seconds=60)
POLL, LONGEST_POLL = 0.5, 2.0
#: Once every person is done: how long to wait for the run's orders to settle (seconds).
SETTLE_LIMIT = 120.0
#: Once every order settled: how long to wait for approved refunds to reach a final state.
REFUNDS_LIMIT = 90.0
#: A payment is started at least this long before the pay deadline (the server refuses later).
PAY_MARGIN = MIN_PAY_WINDOW + timedelta(seconds=2)
OPERATOR_EVERY = (2.0, 4.0)
REJECT_SHARE = 0.15
#: Setup calls made at once.
SETUP_CONCURRENCY = 8

MARKET_SELLERS, BUYERS, SHOWS, SEAT_LIMIT, FLASH_LIMIT = 4, 40, 3, 8, 5
#: Seats of one show at most: a show's seats go in one request, which must stay under 64 KiB.
SHOW_SEATS = 600
#: A buyer for every this many orders of a flow at least: a paid ticket is final, so each buyer
#: can hold or buy at most SEAT_LIMIT seats of a show.
ORDERS_PER_BUYER = 8
SECTION = 100  # seats a section of a show
SKUS = (("mug", "30.00"), ("tee", "79.00"), ("cap", "45.50"), ("poster", "32.00"))
SKU_STOCK = 1_000_000
TEMPLATES = (("5 off 30", "5.00", "30.00"), ("12 off 60", "12.00", "60.00"))


@dataclass(frozen=True)
class Target:
    """The fleet to load."""

    api_urls: list[str]  # base URLs of the API processes, e.g. ["http://127.0.0.1:8101", ...]
    sim_url: str  # the simulator's base URL (control API at {sim_url}/control/...)
    admin_token: str  # an admin's bearer token


@dataclass(frozen=True)
class Plan:
    """How much load, for how long."""

    seconds: float  # place new orders for this long, then let the started people finish
    rate: float  # orders placed per second, all flows together (aim, Poisson-ish)
    seed: int
    flows: tuple[str, ...] = ("marketplace", "tickets", "shop")


class Unreachable(Exception):
    """No API process (or the simulator) answered sensibly within :data:`RETRY_FOR` seconds."""


class Stale(Exception):
    """An order stayed where it was :data:`GIVE_UP` past its deadline."""


def _now() -> datetime:
    return datetime.now(UTC)


async def _sleep_until(when: datetime) -> None:
    delay = (when - _now()).total_seconds()
    if delay > 0:
        await asyncio.sleep(delay)


def _pick(rng: random.Random, weights: Mapping[str, float]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


@dataclass
class Figures:
    """What the run did, counted as it goes."""

    orders: Counter[str] = field(default_factory=Counter)
    order_ids: list[int] = field(default_factory=list)
    habits: Counter[str] = field(default_factory=Counter)
    n: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    refused_by_action: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    retry_reasons: Counter[str] = field(default_factory=Counter)
    #: The first message of each refusal (``action:code``) and error type: evidence.
    examples: dict[str, str] = field(default_factory=dict)

    SCALARS = (
        "payments_started",
        "paid",
        "duplicates_sent",
        "late_payments",
        "paid_twice_attempts",
        "pay_on_close",
        "pay_refused_closed",
        "paid_after_close",
        "cancels",
        "ships",
        "late_ships",
        "receipts",
        "reviews",
        "refunds_approved",
        "refunds_rejected",
        "refunds_retried",
        "retries",
    )

    def as_json(self, seconds: float, extra: Mapping[str, Any]) -> dict[str, Any]:
        """The figures as :func:`run_load` returns them."""
        return {
            "orders": dict(self.orders),
            "order_ids": sorted(self.order_ids),
            "habits": dict(sorted(self.habits.items())),
            **{name: self.n[name] for name in self.SCALARS},
            "refused": dict(sorted(self.refused.items())),
            "refused_by_action": dict(sorted(self.refused_by_action.items())),
            "errors": dict(sorted(self.errors.items())),
            "retry_reasons": dict(sorted(self.retry_reasons.items())),
            "examples": dict(sorted(self.examples.items())),
            **extra,
            "seconds": round(seconds, 1),
        }


class Fleet:
    """The API processes and the simulator over HTTP, with retries across the API URLs."""

    def __init__(self, target: Target, client: httpx.AsyncClient, figures: Figures) -> None:
        self.urls = [url.rstrip("/") for url in target.api_urls]
        self.sim_url = target.sim_url.rstrip("/")
        self.admin = target.admin_token
        self.client = client
        self.figures = figures
        self.turn = 0

    async def api(
        self, method: str, path: str, token: str, body: Any = None, *, key: str | None = None
    ) -> Any:
        """The JSON answer of an API call; :class:`Refused` for a 4xx. A connection error or a
        5xx (a process restarting) is retried, the same request on the next URL, until
        :data:`RETRY_FOR` seconds have passed (then :class:`Unreachable`)."""
        headers = {"Authorization": f"Bearer {token}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        self.turn += 1
        start = self.turn
        return await self._retried(
            lambda attempt: self.client.request(  # the next URL on each attempt
                method,
                self.urls[(start + attempt) % len(self.urls)] + path,
                json=body,
                headers=headers,
            ),
            f"{method} {ID.sub('/{id}', path.split('?')[0])}",
        )

    async def sim(self, path: str, body: Any = None) -> Any:
        """The JSON answer of a simulator control call (a POST); retried like :meth:`api`."""
        url = f"{self.sim_url}/control{path}"
        return await self._retried(lambda _: self.client.post(url, json=body), f"sim {path}")

    async def _retried(self, send: Any, what: str) -> Any:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + RETRY_FOR
        pause = FIRST_PAUSE
        attempt = 0
        while True:
            try:
                response: httpx.Response = await send(attempt)
            except httpx.TransportError as exc:
                failure = type(exc).__name__
            else:
                if response.status_code < 500:
                    if response.status_code >= 400:
                        raise refusal(response)
                    return response.json()
                failure = f"HTTP {response.status_code}"
            if loop.time() + pause > give_up:
                raise Unreachable(f"{what}: {failure} for {RETRY_FOR:g} s")
            self.figures.n["retries"] += 1
            self.figures.retry_reasons[f"{failure} {what}"] += 1
            await asyncio.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)
            attempt += 1

    async def view(self, order_id: int) -> dict[str, Any]:
        """The order's view (as the admin), times as datetimes."""
        return dates_of(await self.api("GET", f"/api/orders/{order_id}", self.admin))


@dataclass
class User:
    """A user of this run."""

    id: int
    token: str


@dataclass
class Show:
    """A show of this run: its seats nobody of this run asked for yet."""

    id: int
    unasked: list[str]
    asked: Counter[int] = field(default_factory=Counter)  # seats asked for, by buyer id


@dataclass
class World:
    """What the setup made: the people and what they sell."""

    run_id: str
    market_sellers: list[User]
    shop_seller: User
    organizer: User
    buyers: list[User]
    shows: list[Show]
    skus: list[int]
    flash_sale_id: int
    coupons: dict[int, list[int]]  # coupon ids not yet used, by buyer id
    tokens: dict[int, str]  # every user's token by id


async def _limited(limit: asyncio.Semaphore, call: Awaitable[T]) -> T:
    async with limit:
        return await call


async def _add_user(fleet: Fleet, name: str) -> User:
    made = await fleet.api("POST", "/api/admin/users", fleet.admin, {"name": name})
    return User(int(made["id"]), str(made["token"]))


async def set_up(fleet: Fleet, plan: Plan, rng: random.Random) -> World:
    """Users, shows with seats and a per-buyer limit, SKUs, coupon templates with coupons issued
    to the buyers, and a flash sale, sized for the plan."""
    run_id = secrets.token_hex(3)  # names unused by earlier runs against the same fleet
    limit = asyncio.Semaphore(SETUP_CONCURRENCY)
    names = [f"seller{i}-{run_id}" for i in range(MARKET_SELLERS)]
    names += [f"shop-{run_id}", f"organizer-{run_id}"]
    expected = plan.seconds * plan.rate / max(1, len(plan.flows))  # orders of one flow
    buyers_count = max(BUYERS, math.ceil(expected / ORDERS_PER_BUYER))
    names += [f"buyer{i}-{run_id}" for i in range(buyers_count)]
    users = await asyncio.gather(*(_limited(limit, _add_user(fleet, n)) for n in names))
    sellers, (shop_seller, organizer), buyers = (
        users[:MARKET_SELLERS],
        users[MARKET_SELLERS : MARKET_SELLERS + 2],
        users[MARKET_SELLERS + 2 :],
    )
    shows = []
    if "tickets" in plan.flows:
        seats = expected * 1.5 * 2  # about 1.5 seats an order, with room to spare
        count = max(SHOWS, math.ceil(seats / SHOW_SEATS))
        per_show = max(2 * SECTION, math.ceil(seats / count / SECTION) * SECTION)
        shows = [await _add_show(fleet, organizer, run_id, i, per_show, rng) for i in range(count)]
    skus: list[int] = []
    flash_sale_id = 0
    coupons: dict[int, list[int]] = {b.id: [] for b in buyers}
    if "shop" in plan.flows:
        skus, flash_sale_id = await _add_shop(fleet, shop_seller, plan)
        coupons = await _issue_coupons(fleet, shop_seller, buyers, expected, limit)
    return World(
        run_id,
        sellers,
        shop_seller,
        organizer,
        buyers,
        shows,
        skus,
        flash_sale_id,
        coupons,
        {u.id: u.token for u in users},
    )


async def _add_show(
    fleet: Fleet, organizer: User, run_id: str, n: int, seats: int, rng: random.Random
) -> Show:
    now = _now()
    labels = [f"{chr(ord('A') + i // SECTION)}-{i % SECTION + 1}" for i in range(seats)]
    body = {
        "title": f"Soak show {n} {run_id}",
        "venue": "Hall 1",
        "starts_at": (now + timedelta(days=2)).isoformat(),
        "sales_close_at": (now + timedelta(days=1)).isoformat(),
        "seat_limit": SEAT_LIMIT,
        "seats": [{"label": label, "price": "50.00"} for label in labels],
    }
    show = await fleet.api("POST", "/api/shows", organizer.token, body)
    rng.shuffle(labels)
    return Show(int(show["id"]), labels)


async def _add_shop(fleet: Fleet, seller: User, plan: Plan) -> tuple[list[int], int]:
    """The SKUs and a flash sale open for the whole plan and well after."""
    skus = []
    for title, price in SKUS:
        body = {"title": title, "price": price, "stock": SKU_STOCK}
        skus.append(int((await fleet.api("POST", "/api/skus", seller.token, body))["id"]))
    sneakers = {"title": "sneakers", "price": "120.00", "stock": SKU_STOCK}
    sneakers_id = (await fleet.api("POST", "/api/skus", seller.token, sneakers))["id"]
    now = _now()
    sale = {
        "sku_id": sneakers_id,
        "price": "59.00",
        "stock": SKU_STOCK // 2,
        "starts_at": (now - timedelta(seconds=1)).isoformat(),
        "ends_at": (now + timedelta(seconds=plan.seconds) + timedelta(hours=1)).isoformat(),
        "per_buyer_limit": FLASH_LIMIT,
    }
    flash = await fleet.api("POST", "/api/flash-sales", seller.token, sale)
    return skus, int(flash["id"])


async def _issue_coupons(
    fleet: Fleet, seller: User, buyers: list[User], expected: float, limit: asyncio.Semaphore
) -> dict[int, list[int]]:
    """Enough coupons for the shop orders with a coupon (a third of them), spread over the
    buyers, from the templates in turn."""
    each = max(1, math.ceil(expected / 3 * 1.5 / len(buyers)))
    now = _now()
    templates = []
    for title, off, minimum in TEMPLATES:
        body = {
            "title": title,
            "amount_off": off,
            "min_amount": minimum,
            "valid_from": (now - timedelta(minutes=1)).isoformat(),
            "valid_until": (now + timedelta(days=2)).isoformat(),
            "total": each * len(buyers),
        }
        made = await fleet.api("POST", "/api/coupon-templates", seller.token, body)
        templates.append(int(made["id"]))

    async def issue(template_id: int, buyer: User) -> tuple[int, int]:
        path = f"/api/coupon-templates/{template_id}/issue"
        got = await fleet.api("POST", path, seller.token, {"user_id": buyer.id})
        return buyer.id, int(got["id"])

    asks = [(templates[i % len(templates)], b) for i in range(each) for b in buyers]
    issued = await asyncio.gather(*(_limited(limit, issue(t, b)) for t, b in asks))
    coupons: dict[int, list[int]] = {b.id: [] for b in buyers}
    for buyer_id, coupon_id in issued:
        coupons[buyer_id].append(coupon_id)
    return coupons


class Crowd:
    """The people of one run, each acting through :class:`Fleet`."""

    def __init__(self, fleet: Fleet, world: World, figures: Figures, rng: random.Random) -> None:
        self.fleet = fleet
        self.world = world
        self.figures = figures
        self.rng = rng

    async def act(self, what: str, call: Awaitable[T]) -> T | None:
        """Do something a person does; a refusal is a normal outcome, counted by its code."""
        try:
            return await call
        except Refused as exc:
            self.figures.refused[exc.code] += 1
            self.figures.refused_by_action[f"{what}:{exc.code}"] += 1
            self.figures.examples.setdefault(f"{what}:{exc.code}", exc.message)
            return None

    async def person(self, n: int, flow: str, rng: random.Random) -> None:
        """One order's people, from placing to the last review; never raises (an exception is
        counted under ``errors`` and ends only this person)."""
        try:
            async with asyncio.timeout(PERSON_LIMIT):
                await self._life(n, flow, rng)
        except Exception as exc:  # one person's failure must not end the run
            self.figures.errors[type(exc).__name__] += 1
            self.figures.examples.setdefault(type(exc).__name__, str(exc)[:300])

    async def _life(self, n: int, flow: str, rng: random.Random) -> None:
        buyer = rng.choice(self.world.buyers)
        order = await self.place(n, flow, buyer, rng)
        if order is None:
            return
        habit = _pick(rng, BUYER_HABITS)
        self.figures.habits[habit] += 1
        if not await self.pay_by_habit(order, habit, buyer, rng):
            return
        # A late payment's order moves at its deadline (or is cancelled then).
        late = order["pay_deadline"] if habit == "pays_late" else None
        view = await self.left(order["id"], "pending_payment", not_before=late)
        if view["status"] != "pending_shipment":
            return  # a paid ticket, or cancelled meanwhile
        await self.deliver(view, buyer, rng)

    async def place(
        self, n: int, flow: str, buyer: User, rng: random.Random
    ) -> dict[str, Any] | None:
        """Place an order of ``flow`` (an ``Idempotency-Key`` on it); its view, or None when
        dueflow refused it (counted)."""
        world = self.world
        if flow == "marketplace":
            seller = rng.choice(world.market_sellers)
            price = f"{rng.randint(5, 500)}.{rng.randint(0, 99):02d}"
            goods = await self.fleet.api(
                "POST", "/api/goods", seller.token, {"title": f"item {n}", "price": price}
            )
            body: dict[str, Any] = {"goods_id": goods["id"]}
        elif flow == "tickets":
            body = self._seats(buyer, rng)
        elif flow == "shop":
            kind = rng.choice(SHOP_KINDS)
            self.figures.habits[f"shop_{kind}"] += 1
            body = self._shop_body(kind, buyer, rng)
        else:
            raise ValueError(f"unknown flow {flow!r}")
        key = f"soak-{world.run_id}-{n}"
        answer = await self.act(
            f"order_{flow}", self.fleet.api("POST", "/api/orders", buyer.token, body, key=key)
        )
        if answer is None:
            return None
        self.figures.orders[flow] += 1
        self.figures.order_ids.append(int(answer["id"]))
        return dates_of(answer)

    def _seats(self, buyer: User, rng: random.Random) -> dict[str, Any]:
        """One or two seats of a show where the buyer has room under the limit (as far as this
        run knows); when none has, seats anyway (the limit refuses them)."""
        count = rng.choice((1, 1, 2))
        roomy = [
            s
            for s in self.world.shows
            if s.asked[buyer.id] + count <= SEAT_LIMIT and len(s.unasked) >= count
        ]
        show = rng.choice(roomy or self.world.shows)
        labels = [show.unasked.pop() for _ in range(min(count, len(show.unasked)))] or ["A-1"]
        show.asked[buyer.id] += len(labels)
        return {"show_id": show.id, "seats": labels}

    def _shop_body(self, kind: str, buyer: User, rng: random.Random) -> dict[str, Any]:
        if kind == "flash":
            return {"flash_sale_id": self.world.flash_sale_id, "quantity": 1}
        coupons = self.world.coupons.get(buyer.id, [])
        coupon = kind == "lines_coupon" and bool(coupons)
        # With a coupon: two lines of two units at least, above every template's minimum.
        fewest = 2 if coupon else 1
        chosen = rng.sample(self.world.skus, rng.randint(fewest, min(3, len(self.world.skus))))
        body: dict[str, Any] = {
            "lines": [{"sku_id": s, "quantity": rng.randint(fewest, 2)} for s in chosen]
        }
        if coupon:
            body["coupon_id"] = coupons.pop()
        return body

    async def pay_by_habit(
        self, order: Mapping[str, Any], habit: str, buyer: User, rng: random.Random
    ) -> bool:
        """The buyer's part of the pay window; True when the order may go on to its seller."""
        order_id, created = order["id"], order["created_at"]
        pay_deadline: datetime = order["pay_deadline"]
        window = pay_deadline - created
        latest = pay_deadline - PAY_MARGIN
        path = f"/api/orders/{order_id}"

        def at(fraction: float) -> datetime:
            when: datetime = created + window * fraction
            return min(when, latest)

        provider = rng.choice(("alipay", "wechatpay"))
        if habit == "never_pays":
            return False
        if habit == "cancels":
            await _sleep_until(order["created_at"] + window * rng.uniform(0.1, 0.8))
            if await self.act("cancel", self.fleet.api("POST", f"{path}/cancel", buyer.token)):
                self.figures.n["cancels"] += 1
            return False
        if habit == "pays_twice":
            await _sleep_until(at(rng.uniform(0.1, 0.3)))
            trades = [await self.start(order_id, p, buyer) for p in ("alipay", "wechatpay")]
            self.figures.n["paid_twice_attempts"] += 1
            # Both at once, before the first payment's close of the other trade gets there.
            await asyncio.gather(*(self.pay(t) for t in trades if t is not None))
            return True
        await _sleep_until(at(rng.uniform(*((0.5, 0.7) if habit == "pays_late" else (0.05, 0.6)))))
        trade = await self.start(order_id, provider, buyer)
        if trade is None:
            return False
        if habit == "pays_after_close":
            await self.left(order_id, "pending_payment", not_before=pay_deadline)
            return await self.pay(trade, after_close=True)
        if habit == "pays_on_close":
            await self.fleet.sim("/pay-on-close", trade)
            self.figures.n["pay_on_close"] += 1
            await self.act(
                "cancel_while_paying", self.fleet.api("POST", f"{path}/cancel", buyer.token)
            )
            return True
        if habit == "pays_late":
            held = (pay_deadline - _now()).total_seconds() + rng.uniform(1.0, 3.0)
            self.figures.n["late_payments"] += 1
            return await self.pay(trade, delay=held)
        copies = rng.randint(2, 4) if habit == "pays_duplicate" else 1
        self.figures.n["duplicates_sent"] += copies - 1
        return await self.pay(trade, copies=copies)

    async def start(self, order_id: int, provider: str, buyer: User) -> dict[str, Any] | None:
        """Start a payment through ``provider`` and scan its code where Alipay needs it; the
        trade, or None when dueflow refused to start it (counted)."""
        started = await self.act(
            "payment_start",
            self.fleet.api(
                "POST", f"/api/orders/{order_id}/payments", buyer.token, {"provider": provider}
            ),
        )
        if started is None:
            return None
        self.figures.n["payments_started"] += 1
        trade = {"provider": provider, "out_trade_no": started["pay_no"]}
        if provider == "alipay":  # an Alipay QR trade exists only once scanned
            await self.fleet.sim("/scan", trade)
        return trade

    async def pay(
        self,
        trade: Mapping[str, Any],
        *,
        copies: int = 1,
        delay: float = 0.0,
        after_close: bool = False,
    ) -> bool:
        """Pay a trade at the simulator; False when it refused (the trade closed or expired:
        ``pay_refused_closed``)."""
        body = {**trade, "duplicate": copies, "delay": max(0.0, delay)}
        try:
            await self.fleet.sim("/pay", body)
        except Refused as exc:
            if exc.status != 409:
                raise
            self.figures.n["pay_refused_closed"] += 1
            return False
        self.figures.n["paid"] += 1
        if after_close:
            self.figures.n["paid_after_close"] += 1
        return True

    async def left(
        self, order_id: int, status: str, *, not_before: datetime | None = None
    ) -> dict[str, Any]:
        """The order's view once it has left ``status`` (looked at from ``not_before`` on, less
        and less often); :class:`Stale` when it is still there :data:`GIVE_UP` past the
        deadline it waits for."""
        if not_before is not None:
            await _sleep_until(not_before)
        pause = POLL
        while True:
            view = await self.fleet.view(order_id)
            if view["status"] != status:
                return view
            deadline = view.get(DEADLINE_OF.get(status, ""))
            if deadline is not None and _now() > deadline + GIVE_UP:
                raise Stale(f"order {order_id} is still {status} past its deadline")
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, LONGEST_POLL)

    async def deliver(self, paid: Mapping[str, Any], buyer: User, rng: random.Random) -> None:
        """The seller's habit from payment on, then the buyer's receipt and the reviews."""
        order_id = paid["id"]
        path = f"/api/orders/{order_id}"
        seller = self.world.tokens[paid["seller_id"]]
        habit = _pick(rng, SELLER_HABITS)
        self.figures.habits[habit] += 1
        if habit == "never_ships":
            return
        late = habit == "ships_late"
        window = paid["ship_deadline"] - paid["paid_at"]
        await _sleep_until(
            paid["paid_at"] + window * rng.uniform(*((1.1, 1.3) if late else (0.1, 0.7)))
        )
        shipment = {"carrier": "SF", "tracking_no": f"SF{order_id:08d}"}
        self.figures.n["late_ships" if late else "ships"] += 1
        what = "ship_late" if late else "ship"
        if await self.act(what, self.fleet.api("POST", f"{path}/ship", seller, shipment)) is None:
            return
        shipped = await self.fleet.view(order_id)
        if shipped["status"] != "shipped":
            return
        receive = shipped["receive_deadline"] - shipped["shipped_at"]
        if rng.random() < 0.5:
            self.figures.habits["confirms"] += 1
            await _sleep_until(shipped["shipped_at"] + receive * rng.uniform(0.1, 0.7))
            confirm = self.fleet.api("POST", f"{path}/confirm-receipt", buyer.token)
            if await self.act("confirm", confirm) is not None:
                self.figures.n["receipts"] += 1
        else:  # left to the confirm_receipt timer
            self.figures.habits["awaits_auto_receipt"] += 1
            await _sleep_until(shipped["receive_deadline"])
        received = await self.left(order_id, "shipped")
        if received["status"] != "received":
            return
        review = received["review_deadline"] - received["received_at"]
        for role, token, share in (("buyer", buyer.token, 0.4), ("seller", seller, 0.3)):
            if rng.random() < share:
                self.figures.habits[f"{role}_reviews"] += 1
                await _sleep_until(received["received_at"] + review * rng.uniform(0.1, 0.5))
                rating = {"rating": rng.randint(3, 5), "comment": "soak"}
                done = self.fleet.api("POST", f"{path}/reviews", token, rating)
                if await self.act(f"review_{role}", done) is not None:
                    self.figures.n["reviews"] += 1


class Operator:
    """Works the refund queue: approves most refunds in review, rejects a few with a reason,
    retries failed ones, so every approved refund goes to the simulator."""

    def __init__(self, crowd: Crowd, rng: random.Random) -> None:
        self.crowd = crowd
        self.fleet = crowd.fleet
        self.figures = crowd.figures
        self.rng = rng

    async def sweep(self) -> int:
        """One pass over the queue; how many refunds it moved."""
        moved = 0
        base = "/api/admin/refunds"
        waiting = await self.fleet.api("GET", f"{base}?state=pending_review", self.fleet.admin)
        for refund in waiting:
            if self.rng.random() < REJECT_SHARE:
                body = {"reason": "soak operator: refused"}
                call = self.fleet.api(
                    "POST", f"{base}/{refund['id']}/reject", self.fleet.admin, body
                )
                if await self.crowd.act("refund_reject", call) is not None:
                    self.figures.n["refunds_rejected"] += 1
                    moved += 1
            else:
                call = self.fleet.api("POST", f"{base}/{refund['id']}/approve", self.fleet.admin)
                if await self.crowd.act("refund_approve", call) is not None:
                    self.figures.n["refunds_approved"] += 1
                    moved += 1
        for refund in await self.fleet.api("GET", f"{base}?state=failed", self.fleet.admin):
            call = self.fleet.api("POST", f"{base}/{refund['id']}/retry", self.fleet.admin)
            if await self.crowd.act("refund_retry", call) is not None:
                self.figures.n["refunds_retried"] += 1
                moved += 1
        return moved

    async def work(self, done: asyncio.Event) -> None:
        """Sweep every few seconds until ``done``; a failed sweep is counted, not fatal."""
        while not done.is_set():
            await self.safe_sweep()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), self.rng.uniform(*OPERATOR_EVERY))

    async def safe_sweep(self) -> int:
        try:
            return await self.sweep()
        except Exception as exc:  # the operator goes on after a failed pass
            self.figures.errors[f"operator:{type(exc).__name__}"] += 1
            return 0

    async def processing(self) -> int:
        """How many refunds are being processed at their provider (the whole server's)."""
        answer = await self.fleet.api(
            "GET", "/api/admin/refunds?state=processing", self.fleet.admin
        )
        return len(answer)


async def _settle(crowd: Crowd, limit: float) -> list[int]:
    """Wait (at most ``limit`` seconds) until every order of the run rests in
    :data:`SETTLED`; the ids of those that do not."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + limit
    pending = sorted(crowd.figures.order_ids)
    views = asyncio.Semaphore(SETUP_CONCURRENCY)
    while pending:
        found = await asyncio.gather(
            *(_limited(views, crowd.fleet.view(i)) for i in pending), return_exceptions=True
        )
        pending = [
            i
            for i, v in zip(pending, found, strict=True)
            if isinstance(v, BaseException) or v["status"] not in SETTLED
        ]
        if not pending or loop.time() > give_up:
            break
        await asyncio.sleep(2 * POLL)
    return pending


async def run_load(
    target: Target, plan: Plan, *, stop: asyncio.Event | None = None
) -> dict[str, Any]:
    """Set up the run's world, place orders at the plan's rate for ``plan.seconds`` (or until
    ``stop`` is set), let the started people finish, wait for the run's orders to settle and
    the refunds to be worked, and return the load figures (JSON-able): ``orders`` by flow,
    ``order_ids``, ``habits`` drawn, the counts of payments started, paid, duplicate
    notifications asked for, late payments, paid-twice attempts, pay-on-close, payments the
    simulator refused because the trade was closed, cancels, ships, late ships, receipts,
    reviews, refunds approved and rejected, ``retries``, ``refused`` by code, ``errors`` by
    exception type, when the last order was placed (``placing_ended``), the people started, the
    orders placed a second, and the ``seconds`` it all took."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    stop = stop or asyncio.Event()
    rng = random.Random(plan.seed)
    figures = Figures()
    timeout = httpx.Timeout(HTTP_TIMEOUT)
    limits = httpx.Limits(max_connections=MAX_PERSONS, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        fleet = Fleet(target, client, figures)
        world = await set_up(fleet, plan, rng)
        crowd = Crowd(fleet, world, figures, rng)
        operator = Operator(crowd, random.Random(rng.getrandbits(64)))
        done = asyncio.Event()
        working = asyncio.create_task(operator.work(done))
        people = await _place_all(crowd, plan, stop, rng)
        placing_ended = _now()
        await asyncio.gather(*people)
        unsettled = await _settle(crowd, SETTLE_LIMIT)
        done.set()
        await working
        left_processing = await _work_refunds(operator)
    extra = {
        "unsettled_orders": unsettled,
        "refunds_processing_at_end": left_processing,
        "placing_ended": placing_ended.isoformat(),
        "people": len(people),
        "placed_per_s": round(len(figures.order_ids) / plan.seconds, 2),
    }
    return figures.as_json(loop.time() - began, extra)


async def _place_all(
    crowd: Crowd, plan: Plan, stop: asyncio.Event, rng: random.Random
) -> list[asyncio.Task[None]]:
    """Start one person per order, Poisson arrivals at ``plan.rate``, until ``plan.seconds``
    have passed or ``stop`` is set; at most :data:`MAX_PERSONS` act at once."""
    loop = asyncio.get_running_loop()
    end = loop.time() + plan.seconds
    places = asyncio.Semaphore(MAX_PERSONS)
    people: list[asyncio.Task[None]] = []
    next_at = loop.time()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_at - loop.time()))
        if stop.is_set() or loop.time() >= end:
            break
        try:
            await asyncio.wait_for(places.acquire(), max(0.0, end - loop.time()))
        except TimeoutError:
            break
        # Each flow once first (a short, slow run still places every flow), then at random.
        flow = plan.flows[len(people)] if len(people) < len(plan.flows) else rng.choice(plan.flows)
        task = asyncio.create_task(
            crowd.person(len(people), flow, random.Random(rng.getrandbits(64)))
        )
        task.add_done_callback(lambda _: places.release())
        people.append(task)
        next_at += rng.expovariate(plan.rate)
    return people


async def _work_refunds(operator: Operator) -> int:
    """The last passes over the refund queue, then wait (at most :data:`REFUNDS_LIMIT`) for
    the processing refunds to end; how many are still processing."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + REFUNDS_LIMIT
    left = -1
    while loop.time() < give_up:
        moved = await operator.safe_sweep()
        try:
            left = await operator.processing()
        except (Refused, Unreachable):
            left = -1
        if moved == 0 and left == 0:
            break
        await asyncio.sleep(2 * POLL)
    return left


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.soak.load``: one run, its figures printed as JSON."""
    parser = argparse.ArgumentParser(prog="python -m tests.soak.load", description=__doc__)
    parser.add_argument("--api", action="append", required=True, help="an API base URL")
    parser.add_argument("--sim", required=True, help="the payment simulator's base URL")
    parser.add_argument("--admin-token", required=True)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=10.0, help="orders a second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--flows", default="marketplace,tickets,shop")
    args = parser.parse_args(argv)
    target = Target(api_urls=args.api, sim_url=args.sim, admin_token=args.admin_token)
    plan = Plan(args.seconds, args.rate, args.seed, tuple(args.flows.split(",")))
    print(json.dumps(asyncio.run(run_load(target, plan)), indent=2))


if __name__ == "__main__":
    main()
