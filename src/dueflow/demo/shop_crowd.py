"""The shop demo's people, in process (:mod:`dueflow.demo.shop`) or over HTTP
(:mod:`dueflow.demo.http_shop`): what is on sale, when each buyer comes, what they order and
how they go about it.

A seller puts five SKUs on sale, makes three coupon templates (one valid for a little more than a
pay window) and issues coupons to buyers until a template runs out; a second seller sells kites.
Buyers come over the first part of a pay window and order one to three lines, most with their
best coupon: some try a coupon below its minimum (refused, then placed again without it under
the same Idempotency-Key), some lose the answer and send the same request again (the first
order comes back), some place two orders at once with one coupon (one gets it), and a refused
buyer (out of stock) reads what is left and orders that. Half of them also rush a flash sale of
the sneakers (its own units, a limit of two a buyer): early ones find it not open, greedy ones
run into the limit, late ones find it ended. Each order then follows one of
:data:`dueflow.demo.marketplace.BUYER_HABITS` and each paid one one of
:data:`dueflow.demo.marketplace.SELLER_HABITS`: paid and shipped (receipt confirmed or left to the
timer), never paid (the units and the coupon come back, an early-bird coupon as expired), cancelled,
paid by a late bank transfer (a discrepancy and a refund), never shipped (a refund; the units stay
sold). The seller restocks the posters midway.

"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from dueflow.demo import marketplace

#: The shop's SKUs: title, price, units on sale per buyer (at least :data:`MIN_STOCK`; the
#: flash sale's SKU has the sale's units besides, and shop orders leave it to the sale).
SKUS = (
    ("mug", "25.00", 1.0),
    ("tee", "79.00", 1.0),
    ("cap", "49.90", 0.8),
    ("poster", "15.00", 0.1),
    ("sneakers", "299.00", 0.0),
)
MIN_STOCK = 3
#: The SKU the seller restocks midway (by its first stock), and when, in shop pay windows.
RESTOCKED, RESTOCK_AT = "poster", 0.9
#: Coupon templates: title, amount off, minimum order, validity in shop pay windows (None: a
#: day), and the share of buyers it may be issued to.
TEMPLATES = (
    ("5 off 50", "5.00", "50.00", None, 1.0),
    ("20 off 150", "20.00", "150.00", None, 0.4),
    ("early bird 10 off 60", "10.00", "60.00", 1.2, 0.4),
)
#: The chance a buyer asks for a coupon of each template.
ASKS_FOR_COUPON = 0.5
#: The order type of a flash sale's orders (``dueflow.service.shop.FLASH_ORDER_TYPE``).
FLASH_ORDER_TYPE = "flash"
#: The flash sale: its SKU, price, per-buyer limit and window (in shop pay windows).
FLASH_SKU, FLASH_PRICE, FLASH_LIMIT = "sneakers", "99.00", 2
FLASH_OPENS, FLASH_CLOSES = 0.25, 1.25
#: The buyers who rush the flash sale; of them, who come a little early and who late.
FLASH_SHARE, FLASH_EARLY, FLASH_LATE = 0.5, 0.1, 0.1
#: Shop orders are placed over the first part of a pay window.
ARRIVE_UNTIL = 0.6
#: A buyer's chances: to send the same request again (the answer was lost), to try a coupon
#: whatever its minimum, to place two orders at once with one coupon.
RETRIES, BARGAINS, GREEDY = 0.2, 0.15, 0.1


@dataclass(frozen=True)
class Coupon:
    """A buyer's coupon and its terms."""

    id: int
    amount_off: Decimal
    min_amount: Decimal


@dataclass
class Shop:
    """What is on sale: the SKUs by title (id and price), the flash sale, the other seller's
    SKU, the units each SKU and the sale were put on sale with, and the buyers' coupons."""

    skus: dict[str, tuple[int, Decimal]]
    flash_sale_id: int
    other_sku: int
    #: When everything was on sale: the flash sale's window and the buyers' times count from it.
    opened_at: datetime
    #: Units put on sale per SKU id (first stock plus restocks), and for the flash sale.
    stocked: dict[int, int] = field(default_factory=dict)
    flash_stocked: int = 0
    coupons: dict[Any, list[Coupon]] = field(default_factory=dict)


def request_hash(body: Mapping[str, Any]) -> str:
    """The hash a key is tied to: the request's JSON with sorted keys."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def flash_units(buyers: int) -> int:
    """The flash sale's units: fewer than its rush wants."""
    return max(MIN_STOCK, buyers // 4)


def sku_stock(title: str, share: float, buyers: int) -> int:
    """A SKU's first stock for this many buyers (the flash sale's SKU also has the sale's
    units: a flash order holds units of both)."""
    extra = flash_units(buyers) if title == FLASH_SKU else 0
    return max(MIN_STOCK, round(share * buyers)) + extra


def validity(windows: float | None, pay: timedelta) -> timedelta:
    """How long a template's coupons are valid: ``windows`` shop pay windows, or a day."""
    return pay * windows if windows is not None else timedelta(days=1)


def coupon_asks(buyers: Sequence[Any]) -> list[tuple[int, Any]]:
    """Who asks the seller for a coupon of which template (its index), in order."""
    rng = random.Random(len(buyers))
    return [
        (n, buyer)
        for n in range(len(TEMPLATES))
        for buyer in buyers
        if rng.random() < ASKS_FOR_COUPON
    ]


def rushes_to_pay(order: Mapping[str, Any], person: marketplace.Person) -> bool:
    """A flash order of a buyer who pays is paid at once: its pay window is short (20 s on the
    dev profile, well under a real second in fast time), and a payment started near its end
    leaves the order to close-or-query after the deadline."""
    return order["order_type"] == FLASH_ORDER_TYPE and person.buyer in marketplace.PAYING


def template_total(share: float, buyers: int) -> int:
    return max(1, round(share * buyers))


def template_terms(
    template: tuple[str, str, str, float | None, float],
    now: datetime,
    pay: timedelta,
    buyers: int,
) -> dict[str, Any]:
    """One of :data:`TEMPLATES` as the seller makes it for this many buyers, valid from ``now``
    (``pay``: a shop pay window): the fields of ``POST /api/coupon-templates``, times as
    datetimes."""
    title, off, minimum, windows, share = template
    return {
        "title": title,
        "amount_off": off,
        "min_amount": minimum,
        "valid_from": now,
        "valid_until": now + validity(windows, pay),
        "total": template_total(share, buyers),
    }


def flash_sale_terms(
    sku_id: int, opened_at: datetime, pay: timedelta, buyers: int
) -> dict[str, Any]:
    """The flash sale of the SKU ``sku_id`` (:data:`FLASH_SKU`) for this many buyers, its window
    in shop pay windows ``pay`` from the opening: the fields of ``POST /api/flash-sales``,
    times as datetimes."""
    return {
        "sku_id": sku_id,
        "price": FLASH_PRICE,
        "stock": flash_units(buyers),
        "starts_at": opened_at + pay * FLASH_OPENS,
        "ends_at": opened_at + pay * FLASH_CLOSES,
        "per_buyer_limit": FLASH_LIMIT,
    }


class Crowd(ABC):
    """The shop's buyers, in process or over HTTP: what they order and how; each order's habits
    are kept in :attr:`people`, each repeated request's verdict in :attr:`repeats`."""

    rng: random.Random
    shop: Shop
    people: dict[int, marketplace.Person]
    refused: Counter[str]
    #: For each request sent again under its key: did it answer the first order?
    repeats: list[bool]
    #: The habits orders are given (:data:`dueflow.demo.marketplace.BUYER_HABITS` or the HTTP
    #: ones).
    buyer_habits: Mapping[str, float] = marketplace.BUYER_HABITS

    @abstractmethod
    async def place(self, buyer: Any, body: dict[str, Any], key: str) -> dict[str, Any] | str:
        """``POST /api/orders`` with ``body`` (``lines`` and maybe ``coupon_id``, or
        ``flash_sale_id`` and ``quantity``) under the Idempotency-Key ``key``: the order's
        view, or the refusal's code (each refusal counted by its code)."""

    @abstractmethod
    async def on_sale(self) -> dict[int, int]:
        """Units on sale now, by SKU id."""

    @abstractmethod
    async def order_life(
        self, order: dict[str, Any], person: marketplace.Person, buyer: Any
    ) -> None:
        """The order after placing: paid or not by the buyer's habit, shipped or not by the
        seller's, its receipt confirmed or left to the timer."""

    def pick_lines(self) -> list[dict[str, int]]:
        """One to three SKUs of the shop (not the flash sale's), one to three units each, in SKU
        order."""
        rng, skus = self.rng, self.shop.skus
        titles = rng.sample(sorted(set(skus) - {FLASH_SKU}), rng.choice([1, 2, 2, 3]))
        ids = sorted(skus[t][0] for t in titles)
        return [{"sku_id": sku_id, "quantity": rng.choice([1, 1, 2, 3])} for sku_id in ids]

    def pick_coupon(self, buyer: Any, lines: Sequence[Mapping[str, int]]) -> int | None:
        """The buyer's best coupon for these lines (a bargain hunter's largest, whatever its
        minimum); none when none fits."""
        prices = dict(self.shop.skus.values())
        total = sum(prices[line["sku_id"]] * line["quantity"] for line in lines)
        mine = sorted(self.shop.coupons.get(buyer, []), key=lambda c: c.amount_off, reverse=True)
        if mine and self.rng.random() < BARGAINS:
            return mine[0].id
        fits = [c for c in mine if c.min_amount <= total]
        return fits[0].id if fits else None

    async def order(self, buyer: Any, body: dict[str, Any], key: str) -> dict[str, Any] | None:
        """Place the order; after a refusal again under the same key (what is left, then
        without the coupon if it does not go any more); once placed, maybe send the request
        again as if its answer was lost."""
        placed = await self.place(buyer, body, key)
        if placed == "out_of_stock" and "lines" in body:
            left = await self.on_sale()
            lines = [
                {"sku_id": line["sku_id"], "quantity": min(line["quantity"], left[line["sku_id"]])}
                for line in body["lines"]
                if left.get(line["sku_id"], 0) > 0
            ]
            if not lines:
                return None
            body = {**body, "lines": lines}
            placed = await self.place(buyer, body, key)
        if placed == "coupon_unusable" and "coupon_id" in body:
            body = {"lines": body["lines"]}
            placed = await self.place(buyer, body, key)
        if isinstance(placed, str):
            return None
        if self.rng.random() < RETRIES:
            again = await self.place(buyer, body, key)
            self.repeats.append(not isinstance(again, str) and again["id"] == placed["id"])
        return placed

    async def follow(self, placed: Sequence[dict[str, Any] | None], buyer: Any) -> None:
        """Give each placed order its habits and live its life."""
        rng, lives = self.rng, []
        for order in placed:
            if order is None:
                continue
            person = marketplace.Person(
                marketplace.pick_habit(rng, dict(self.buyer_habits)),
                marketplace.pick_habit(rng, marketplace.SELLER_HABITS),
                rng.random() < 0.5,
                False,
                False,
            )
            self.people[order["id"]] = person
            lives.append(self.order_life(order, person, buyer))
        await asyncio.gather(*lives)

    async def shop_buyer(self, buyer: Any, n: int) -> None:
        """One buyer's shop order (two at once with one coupon when greedy) and its life."""
        lines = self.pick_lines()
        body: dict[str, Any] = {"lines": lines}
        coupon = self.pick_coupon(buyer, lines)
        if coupon is not None:
            body["coupon_id"] = coupon
        if coupon is not None and self.rng.random() < GREEDY:
            other = {**body, "lines": self.pick_lines()}
            both = (self.order(buyer, body, f"shop-{n}-a"), self.order(buyer, other, f"shop-{n}-b"))
            await self.follow(await asyncio.gather(*both), buyer)
        else:
            await self.follow([await self.order(buyer, body, f"shop-{n}")], buyer)

    async def flash_buyer(self, buyer: Any, n: int) -> None:
        """One buyer at the flash sale: one to three units (past the limit: refused, then one),
        or, greedy, two orders of two at once."""
        sale = self.shop.flash_sale_id
        if self.rng.random() < GREEDY:
            body = {"flash_sale_id": sale, "quantity": 2}
            both = (
                self.order(buyer, body, f"flash-{n}-a"),
                self.order(buyer, body, f"flash-{n}-b"),
            )
            await self.follow(await asyncio.gather(*both), buyer)
            return
        body = {"flash_sale_id": sale, "quantity": self.rng.choice([1, 1, 2, 3])}
        placed = await self.place(buyer, body, f"flash-{n}")
        if placed == "purchase_limit_exceeded":
            placed = await self.place(buyer, {**body, "quantity": 1}, f"flash-{n}")
        await self.follow([None if isinstance(placed, str) else placed], buyer)

    async def wrong_turns(self, people: Sequence[Any]) -> None:
        """Orders refused with nothing taken, by a buyer with coupons: another buyer's coupon,
        SKUs of two sellers, the buyer's coupon on the other seller's SKU."""
        coupons = self.shop.coupons
        holders = [buyer for buyer in people if coupons.get(buyer)] or list(people[:1])
        buyer, others = holders[0], holders[1:]
        mugs = [{"sku_id": self.shop.skus["mug"][0], "quantity": 1}]
        kite = [{"sku_id": self.shop.other_sku, "quantity": 1}]
        if others:
            theirs = coupons[others[0]][0].id
            await self.place(buyer, {"lines": mugs, "coupon_id": theirs}, "wrong-1")
        await self.place(buyer, {"lines": mugs + kite}, "wrong-2")
        if coupons.get(buyer):
            await self.place(buyer, {"lines": kite, "coupon_id": coupons[buyer][0].id}, "wrong-3")


def schedule(rng: random.Random, people: Sequence[Any]) -> list[tuple[float, str, int, Any]]:
    """When each buyer comes, in shop pay windows from the opening: (when, to what, n, buyer),
    the restock among them."""
    events: list[tuple[float, str, int, Any]] = [(RESTOCK_AT, "restock", 0, None)]
    events += [(rng.uniform(0, ARRIVE_UNTIL), "shop", n, b) for n, b in enumerate(people)]
    rushers = rng.sample(list(people), round(FLASH_SHARE * len(people)))
    for n, buyer in enumerate(rushers):
        chance = rng.random()
        if chance < FLASH_EARLY:
            at = FLASH_OPENS - 0.03
        elif chance > 1 - FLASH_LATE:
            at = FLASH_CLOSES + 0.02
        else:
            at = FLASH_OPENS + rng.uniform(0, 0.05)
        events.append((at, "flash", n, buyer))
    return sorted(events, key=lambda e: e[:3])
