"""``dueflow demo --flow shop``: a simulated shop on the dev profile, in fast time.

The people of :mod:`dueflow.demo.shop_crowd` act through the services in process, beside a
worker and its scanner; payments go through the simulated Alipay and WeChat Pay. The invariants
(the engine's and :mod:`dueflow.demo.shop_checks`) are read from the database many times during
the sale and once at the end, when every cancelled order must have had its one notice sent;
the run is a failure if any did not hold at any check.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from dueflow import render
from dueflow.demo import marketplace, shop_crowd
from dueflow.demo import shop_checks as demo_shop_checks
from dueflow.demo.tickets import Promises
from dueflow.domain.lifecycle import OrderStatus
from dueflow.exceptions import DueflowError
from dueflow.notifiers.log import LogNotifier
from dueflow.service import accounts, orders, replays, report, shop
from dueflow.service.deps import Deps
from dueflow.store import idempotency

#: Real seconds between two checks of the invariants during the sale.
CHECK_EVERY = 0.5


class ShopFloor(marketplace.Market, shop_crowd.Crowd):
    """The shop's buyers, placing, paying and cancelling in process."""

    def __init__(
        self, deps: Deps, rng: random.Random, sim: httpx.AsyncClient, shop: shop_crowd.Shop
    ) -> None:
        super().__init__(deps, rng, sim)
        self.shop = shop
        self.people = {}
        self.repeats = []

    async def place(self, buyer: Any, body: dict[str, Any], key: str) -> dict[str, Any] | str:
        # What POST /api/orders does with an Idempotency-Key: the first answer, or a new order.
        tie = idempotency.Key(replays.user(buyer), key, shop_crowd.request_hash(body))
        try:
            again = await replays.replay(self.deps, tie)
            if again is not None:
                first = json.loads(again.body) if again.body is not None else again.view
                assert first is not None
                return await self.view(int(first["id"]))
            if "lines" in body:
                return await shop.place_shop_order(
                    self.deps,
                    buyer_id=buyer,
                    lines=body["lines"],
                    coupon_id=body.get("coupon_id"),
                    key=tie,
                )
            return await shop.place_flash_order(
                self.deps,
                buyer_id=buyer,
                flash_sale_id=body["flash_sale_id"],
                quantity=body["quantity"],
                key=tie,
            )
        except DueflowError as exc:
            self.refused[f"order ({exc.code})"] += 1
            return exc.code

    async def on_sale(self) -> dict[int, int]:
        ids = [sku_id for sku_id, _ in self.shop.skus.values()]
        return {sku_id: (await shop.sku_view(self.deps, sku_id))["stock"] for sku_id in ids}

    async def order_life(
        self, order: dict[str, Any], person: marketplace.Person, buyer: Any
    ) -> None:
        deps, rng, order_id = self.deps, self.rng, order["id"]
        durations = deps.policy.durations(order["order_type"])
        pay = order["pay_deadline"] - order["created_at"]
        if shop_crowd.rushes_to_pay(order, person):
            paid = await self.act("payment", self.pay_online(order_id, buyer, 0.0))
        else:
            paid = await self.pay_by_habit(order, person.buyer, buyer, pay)
        if not paid:
            return
        paid_at = await self.paid_at(order_id)
        if paid_at is None or person.seller == "never_ships":
            return
        late = person.seller == "ships_late"
        await self.at(
            paid_at, rng.uniform(1.1, 1.3) if late else rng.uniform(0.1, 0.8), durations.ship
        )
        shipping = orders.ship(
            deps,
            order_id=order_id,
            user_id=order["seller_id"],
            carrier="SF",
            tracking_no=f"SF{order_id:08d}",
        )
        if not await self.act("late shipping" if late else "shipping", shipping):
            return
        if person.confirms:  # else left to the confirm_receipt timer
            shipped = await self.view(order_id)
            await self.at(shipped["shipped_at"], rng.uniform(0.1, 0.8), durations.receive)
            await self.act(
                "confirm", orders.confirm_receipt(deps, order_id=order_id, user_id=buyer)
            )


async def open_shop(
    deps: Deps, seller: int, other: int, buyers: Sequence[int], refused: Counter[str]
) -> shop_crowd.Shop:
    """The coupon templates and the coupons issued to the buyers who ask (refusals counted in
    ``refused``), then the seller's SKUs and flash sale and the other seller's kites: the shop
    opens once everything is on sale."""
    pay = deps.policy.durations(shop.SHOP_ORDER_TYPE).pay
    templates = []
    for template in shop_crowd.TEMPLATES:
        terms = shop_crowd.template_terms(template, deps.clock.now(), pay, len(buyers))
        tpl = await shop.create_template(deps, seller_id=seller, **terms)
        templates.append(tpl["id"])
    coupons: dict[Any, list[shop_crowd.Coupon]] = {}
    for n, buyer in shop_crowd.coupon_asks(buyers):
        try:
            got = await shop.issue_coupon(
                deps, template_id=templates[n], issuer_id=seller, user_id=buyer
            )
        except DueflowError as exc:
            refused[f"issue ({exc.code})"] += 1
            continue
        coupons.setdefault(buyer, []).append(
            shop_crowd.Coupon(got["id"], got["amount_off"], got["min_amount"])
        )
    skus: dict[str, tuple[int, Decimal]] = {}
    for title, price, share in shop_crowd.SKUS:
        stock = shop_crowd.sku_stock(title, share, len(buyers))
        view = await shop.create_sku(deps, seller_id=seller, title=title, price=price, stock=stock)
        skus[title] = (view["id"], view["price"])
    kite = await shop.create_sku(deps, seller_id=other, title="kite", price="19.90", stock=5)
    now = deps.clock.now()
    terms = shop_crowd.flash_sale_terms(skus[shop_crowd.FLASH_SKU][0], now, pay, len(buyers))
    sale = await shop.create_flash_sale(deps, seller_id=seller, **terms)
    stocked = {
        sku_id: (await shop.sku_view(deps, sku_id))["stocked"] for sku_id, _ in skus.values()
    }
    return shop_crowd.Shop(
        skus, sale["id"], kite["id"], now, {**stocked, kite["id"]: 5}, sale["stocked"], coupons
    )


async def run(
    *, buyers: int, speed: float, db: Path | None, seed: int, live: bool, console: Console
) -> bool:
    """Run the shop; True when every invariant held at every check."""
    async with marketplace.fast_world(speed=speed, db=db) as world:
        deps = world.deps
        seller = (await accounts.add_user(deps, "shop"))[0].id
        other = (await accounts.add_user(deps, "kites"))[0].id
        people = [(await accounts.add_user(deps, f"buyer{i}"))[0].id for i in range(buyers)]
        refused: Counter[str] = Counter()
        the_shop = await open_shop(deps, seller, other, people, refused)
        floor = ShopFloor(deps, random.Random(seed), world.sim, the_shop)
        floor.refused.update(refused)
        pay = deps.policy.durations(shop.SHOP_ORDER_TYPE).pay
        flash = deps.policy.durations(shop.FLASH_ORDER_TYPE).pay
        console.print(
            f"dueflow demo --flow shop: {buyers} buyers, {len(shop_crowd.SKUS)} SKUs, "
            f"{len(shop_crowd.TEMPLATES)} coupon templates, a flash sale of "
            f"{the_shop.flash_stocked} {shop_crowd.FLASH_SKU} (limit {shop_crowd.FLASH_LIMIT} a "
            f"buyer); dev profile at {speed:g}x (shop pay {pay}, flash pay {flash})"
        )
        promises = Promises()
        async with (
            marketplace.worker_running(deps),
            marketplace.watching(
                lambda: _check(deps, floor, promises, speed, over=False), CHECK_EVERY
            ),
        ):
            tasks = await _sell(floor, seller, people, pay)
            with marketplace.live_view(console, live) as view:
                await _settle(deps, tasks, view)
            await asyncio.gather(*tasks)  # a buyer's unexpected error ends the demo loudly
        return await _summarise(deps, world.notifier, floor, promises, console, speed)


async def _check(
    deps: Deps, floor: shop_crowd.Crowd, promises: Promises, speed: float, *, over: bool
) -> None:
    """One check of the invariants into ``promises``: the engine's, then the shop's own (with
    ``over``, those of the sale's end too)."""
    engine = await marketplace.engine_invariants(deps, speed)
    the_shop = floor.shop
    own = await demo_shop_checks.promises(
        deps,
        stocked=the_shop.stocked,
        flash_stocked={the_shop.flash_sale_id: the_shop.flash_stocked},
        over=over,
    )
    own[demo_shop_checks.REPEATS] = [n for n, same in enumerate(floor.repeats) if not same]
    promises.add(engine, own)


async def _sell(
    floor: ShopFloor, seller: int, people: Sequence[int], pay: timedelta
) -> list[asyncio.Task[None]]:
    """The buyers on time, the wrong turns first and the restock midway; the buyers' tasks."""
    start = floor.shop.opened_at
    tasks = [asyncio.create_task(floor.wrong_turns(people))]
    for at, what, n, buyer in shop_crowd.schedule(floor.rng, people):
        await floor.at(start, at, pay)
        if what == "restock":
            await _restock(floor, seller)
        elif what == "shop":
            tasks.append(asyncio.create_task(floor.shop_buyer(buyer, n)))
        else:
            tasks.append(asyncio.create_task(floor.flash_buyer(buyer, n)))
    return tasks


async def _restock(floor: ShopFloor, seller: int) -> None:
    """The seller puts as many posters on sale again as at the start."""
    sku_id = floor.shop.skus[shop_crowd.RESTOCKED][0]
    first = floor.shop.stocked[sku_id]
    view = await shop.restock(floor.deps, sku_id=sku_id, user_id=seller, quantity=first)
    floor.shop.stocked[sku_id] = view["stocked"]


async def _settle(deps: Deps, tasks: Sequence[asyncio.Task[None]], live: Live | None) -> None:
    """Wait until every buyer is done, every order final and every notice sent, updating
    ``live`` (if any) with the snapshot and the units."""
    while True:
        snap = await report.snapshot(deps)
        if live is not None:
            live.update(
                Group(
                    render.snapshot_table(snap, title="dueflow demo --flow shop (live)"),
                    await demo_shop_checks.units_table(deps),
                )
            )
        pending = sum(n for s, n in snap.orders.items() if not OrderStatus(s).is_final)
        done = all(t.done() for t in tasks)
        if done and pending == 0 and await demo_shop_checks.notices_due(deps) == 0:
            return
        await asyncio.sleep(0.2)


async def _summarise(
    deps: Deps,
    notifier: LogNotifier,
    floor: ShopFloor,
    promises: Promises,
    console: Console,
    speed: float,
) -> bool:
    console.print(marketplace.outcomes_table(await floor.finals(floor.people)))
    console.print(await demo_shop_checks.units_table(deps))
    console.print(await _sale_table(deps, floor))
    console.print(await marketplace.figures_table(deps, notifier, floor.refused, speed))
    await _check(deps, floor, promises, speed, over=True)
    console.print(promises.table())
    return marketplace.verdict(console, promises.ok)


async def _sale_table(deps: Deps, floor: ShopFloor) -> Table:
    kinds = Counter([(await floor.view(oid))["order_type"] for oid in floor.people])
    table = Table("measure", "value", title="the sale")
    table.add_row("orders placed", ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    table.add_row(
        "requests sent again under their key",
        f"{len(floor.repeats)} (answered the first order: {sum(floor.repeats)})",
    )
    return table
