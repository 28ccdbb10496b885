"""``dueflow demo --url ... --flow shop``: :mod:`dueflow.demo.shop`'s shop against a running
``dueflow serve`` (dev profile, simulator at ``/sim``), over the HTTP API only.

The seller makes the coupon templates and issues coupons (``POST /api/coupon-templates``,
``.../issue``), puts the SKUs and the flash sale on sale (``POST /api/skus``, ``POST
/api/flash-sales``) and restocks (``POST /api/skus/{id}/restock``); buyers order with an
``Idempotency-Key`` header (``POST /api/orders`` with ``lines`` and ``coupon_id``, or
``flash_sale_id`` and ``quantity``), send a request again as if its answer was lost, pay through
the simulator's control API, cancel, confirm receipt; the seller ships. Time is the server's:
every wait is a fraction of a window read from the orders. The habits are
:data:`dueflow.demo.http.HTTP_BUYER_HABITS` (no late bank transfer over HTTP).

The invariants: the admin summary's (the whole server's) polled during the sale and at the end,
and the run's own read through the API at the end: the SKUs' and the sale's units as put on
sale and as the run's orders' lines say, no coupon of a buyer locked or used but as its order
says, every order's amount, a refund for every paid-then-cancelled order, and one notice sent
for every cancelled order.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from dueflow.demo import http as demo_http
from dueflow.demo import shop_checks as demo_shop_checks
from dueflow.demo import shop_crowd
from dueflow.demo.http import HTTP_PAYING, HttpMarket, Refused, Server
from dueflow.demo.marketplace import Person, live_view, outcomes_table, verdict
from dueflow.demo.shop_checks import DEAD, told
from dueflow.demo.tickets import Promises

#: How long the demo waits, once every order is final, for the last notices (seconds).
LAST_NOTICES = 60.0


class HttpShopFloor(HttpMarket, shop_crowd.Crowd):
    """The shop's buyers, through the API."""

    buyer_habits = demo_http.HTTP_BUYER_HABITS

    def __init__(
        self, server: Server, rng: random.Random, shop: shop_crowd.Shop, sellers: Mapping[int, str]
    ):
        super().__init__(server, rng)
        self.shop = shop
        self.sellers = dict(sellers)
        self.people = {}
        self.repeats = []
        self.views: dict[int, dict[str, Any]] = {}

    async def place(self, buyer: Any, body: dict[str, Any], key: str) -> dict[str, Any] | str:
        headers = {"Authorization": f"Bearer {buyer}", "Idempotency-Key": key}
        response = await self.server.client.post("/api/orders", json=body, headers=headers)
        if response.status_code >= 400:
            refusal = demo_http.refusal(response)
            self.refused[f"order ({refusal.code})"] += 1
            return refusal.code
        return demo_http.dates_of(response.json())

    async def on_sale(self) -> dict[int, int]:
        ids = [sku_id for sku_id, _ in self.shop.skus.values()]
        views = [await self.server.call("GET", f"/api/skus/{i}", self.server.admin) for i in ids]
        return {view["id"]: view["stock"] for view in views}

    async def order_life(self, order: dict[str, Any], person: Person, buyer: Any) -> None:
        try:
            await self._shop_life(order, person, buyer)
        except (httpx.HTTPError, Refused, demo_http.Stale, KeyError, TypeError, ValueError) as exc:
            self.refused[f"gave up ({type(exc).__name__})"] += 1

    async def _shop_life(self, order: dict[str, Any], person: Person, buyer: str) -> None:
        rng, server, order_id = self.rng, self.server, order["id"]
        path, seller = f"/api/orders/{order_id}", self.sellers[order["seller_id"]]
        if shop_crowd.rushes_to_pay(order, person):
            paid = await self.act("payment", self.pay_online(order_id, buyer, 0.0))
        else:
            paid = await self.pay_by_habit(order, person.buyer, buyer)
        if not paid or person.seller == "never_ships":
            return
        pay = order["pay_deadline"] - order["created_at"]
        view = await self.left(order_id, "pending_payment", pay)
        if view["paid_at"] is None:
            return
        late = person.seller == "ships_late"
        ship = view["ship_deadline"] - view["paid_at"]
        await self.at(
            view["paid_at"], rng.uniform(1.1, 1.3) if late else rng.uniform(0.1, 0.8), ship
        )
        shipment = {"carrier": "SF", "tracking_no": f"SF{order_id:08d}"}
        what = "late shipping" if late else "shipping"
        if not await self.act(what, server.call("POST", f"{path}/ship", seller, shipment)):
            return
        if person.confirms:  # else left to the confirm_receipt timer
            shipped = await server.view(order_id)
            receive = shipped["receive_deadline"] - shipped["shipped_at"]
            await self.at(shipped["shipped_at"], rng.uniform(0.1, 0.8), receive)
            await self.act("confirm", server.call("POST", f"{path}/confirm-receipt", buyer))


async def run(
    *, url: str, admin_token: str, buyers: int, seed: int, live: bool, console: Console
) -> bool:
    """Run the shop against the server at ``url``; True when every invariant held.

    Raises:
        BadServer, ServerLost: as :func:`dueflow.demo._http_server.connected` says.
    """
    async with demo_http.connected(url, admin_token) as server:
        run_id = secrets.token_hex(3)
        seller = await _user(server, f"shop-{run_id}")
        other = await _user(server, f"kites-{run_id}")
        people = [await _user(server, f"buyer{i}-{run_id}") for i in range(buyers)]
        shop = await _put_on_sale(server, seller[1], other[1], buyers)
        floor = HttpShopFloor(server, random.Random(seed), shop, dict([seller, other]))
        tokens = [token for _, token in people]
        # The first customer's order tells the server's pay window; everything else is timed
        # in it, from then on.
        first = await floor.place(tokens[0], {"lines": _one_mug(shop)}, "first")
        if isinstance(first, str):
            raise demo_http.ServerLost(f"the first order was refused ({first})")
        pay = first["pay_deadline"] - first["created_at"]
        await _coupons_and_sale(server, floor, seller[1], people, pay)
        console.print(
            f"dueflow demo --flow shop over HTTP: {buyers} buyers, {len(shop_crowd.SKUS)} SKUs, "
            f"{len(shop_crowd.TEMPLATES)} coupon templates, flash sale {shop.flash_sale_id} of "
            f"{shop.flash_stocked} {shop_crowd.FLASH_SKU} (run {run_id}) against "
            f"{url.rstrip('/')} in its own time (shop pay {pay.total_seconds():g} s)"
        )
        promises = Promises()
        async with demo_http.invariants_watched(server, promises):
            tasks = [asyncio.create_task(floor.follow([first], tokens[0]))]
            tasks += await _sell(floor, seller[1], tokens, pay)
            with live_view(console, live) as view:
                await demo_http.wait_until_settled(server, floor.people, tasks, view)
            await asyncio.gather(*tasks)
            views = await _last_notices(server, floor.people)
        return await _summarise(floor, views, tokens, promises, console)


def _one_mug(shop: shop_crowd.Shop) -> list[dict[str, int]]:
    return [{"sku_id": shop.skus["mug"][0], "quantity": 1}]


async def _user(server: Server, name: str) -> tuple[int, str]:
    """A new user made by the admin: (id, token)."""
    made = await server.call("POST", "/api/admin/users", server.admin, {"name": name})
    return int(made["id"]), str(made["token"])


async def _put_on_sale(server: Server, seller: str, other: str, buyers: int) -> shop_crowd.Shop:
    """The seller's SKUs and the other seller's kites (the flash sale comes later)."""
    skus: dict[str, tuple[int, Decimal]] = {}
    stocked: dict[int, int] = {}
    for title, price, share in shop_crowd.SKUS:
        body = {"title": title, "price": price, "stock": shop_crowd.sku_stock(title, share, buyers)}
        view = await server.call("POST", "/api/skus", seller, body)
        skus[title], stocked[view["id"]] = (view["id"], Decimal(view["price"])), view["stocked"]
    kites = {"title": "kite", "price": "19.90", "stock": 5}
    kite = await server.call("POST", "/api/skus", other, kites)
    stocked[kite["id"]] = kite["stocked"]
    return shop_crowd.Shop(skus, 0, kite["id"], server.now(), stocked)


async def _coupons_and_sale(
    server: Server,
    floor: HttpShopFloor,
    seller: str,
    people: Sequence[tuple[int, str]],
    pay: timedelta,
) -> None:
    """The coupon templates, the coupons issued to the buyers who ask, and the flash sale; the
    shop counts as opened now."""
    shop, now = floor.shop, server.now()
    templates = []
    for template in shop_crowd.TEMPLATES:
        body = _json(shop_crowd.template_terms(template, now, pay, len(people)))
        templates.append((await server.call("POST", "/api/coupon-templates", seller, body))["id"])
    for n, (buyer_id, buyer) in shop_crowd.coupon_asks(people):
        path = f"/api/coupon-templates/{templates[n]}/issue"
        try:
            got = await server.call("POST", path, seller, {"user_id": buyer_id})
        except Refused as exc:
            floor.refused[f"issue ({exc.code})"] += 1
            continue
        terms = shop_crowd.Coupon(got["id"], Decimal(got["amount_off"]), Decimal(got["min_amount"]))
        shop.coupons.setdefault(buyer, []).append(terms)
    shop.opened_at = server.now()
    sale_body = _json(
        shop_crowd.flash_sale_terms(
            shop.skus[shop_crowd.FLASH_SKU][0], shop.opened_at, pay, len(people)
        )
    )
    sale = await server.call("POST", "/api/flash-sales", seller, sale_body)
    shop.flash_sale_id, shop.flash_stocked = sale["id"], sale["stocked"]


def _json(terms: Mapping[str, Any]) -> dict[str, Any]:
    """Terms as a request's JSON body: times in ISO 8601."""
    return {
        name: value.isoformat() if isinstance(value, datetime) else value
        for name, value in terms.items()
    }


async def _sell(
    floor: HttpShopFloor, seller: str, tokens: Sequence[str], pay: timedelta
) -> list[asyncio.Task[None]]:
    """The buyers, the wrong turns first and the restock midway, on the server's time."""
    server, start = floor.server, floor.shop.opened_at
    tasks = [asyncio.create_task(floor.wrong_turns(tokens))]
    for at, what, n, buyer in shop_crowd.schedule(floor.rng, tokens):
        await floor.at(start, at, pay)
        if what == "restock":
            sku_id = floor.shop.skus[shop_crowd.RESTOCKED][0]
            body = {"quantity": floor.shop.stocked[sku_id]}
            view = await server.call("POST", f"/api/skus/{sku_id}/restock", seller, body)
            floor.shop.stocked[sku_id] = view["stocked"]
        elif what == "shop":
            tasks.append(asyncio.create_task(floor.shop_buyer(buyer, n)))
        else:
            tasks.append(asyncio.create_task(floor.flash_buyer(buyer, n)))
    return tasks


async def _last_notices(server: Server, people: Mapping[int, Person]) -> dict[int, dict[str, Any]]:
    """The run's order views once every cancelled one has its notice sent (or
    :data:`LAST_NOTICES` seconds have passed)."""
    waited = 0.0
    while True:
        views = {v["id"]: v for v in await demo_http.gather_views(server, sorted(people))}
        unsent = [oid for oid, v in views.items() if v["status"] in DEAD and not told(v)]
        if not unsent or waited >= LAST_NOTICES:
            return views
        await asyncio.sleep(demo_http.POLL)
        waited += demo_http.POLL


async def _summarise(
    floor: HttpShopFloor,
    views: Mapping[int, Mapping[str, Any]],
    tokens: Sequence[str],
    promises: Promises,
    console: Console,
) -> bool:
    server, shop = floor.server, floor.shop
    console.print(
        outcomes_table(((p, views[oid]["status"]) for oid, p in floor.people.items()), HTTP_PAYING)
    )
    admin = server.admin
    units = {
        "sku": {i: await server.call("GET", f"/api/skus/{i}", admin) for i in shop.stocked},
        "flash": {
            shop.flash_sale_id: await server.call(
                "GET", f"/api/flash-sales/{shop.flash_sale_id}", admin
            )
        },
    }
    coupons = [
        c for t in tokens for c in (await server.call("GET", "/api/me/coupons", t))["coupons"]
    ]
    summary = await server.summary()
    console.print(_figures(floor, views, units, coupons, summary))
    promises.add(
        demo_http.invariants_of(summary),
        demo_shop_checks.from_views(shop, views, units, coupons, floor.repeats),
    )
    console.print(promises.table())
    return verdict(console, promises.ok and bool(summary["invariants"].get("ok")))


def _figures(
    floor: HttpShopFloor,
    views: Mapping[int, Mapping[str, Any]],
    units: Mapping[str, Mapping[int, Mapping[str, Any]]],
    coupons: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
) -> Table:
    table = Table("measure", "value", title="figures")
    kinds = Counter(v["order_type"] for v in views.values())
    table.add_row("orders placed", ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    for kind, by_id in units.items():
        for i, v in by_id.items():
            label = f"sku {i} {v['title']}" if kind == "sku" else f"flash sale {i}"
            table.add_row(
                label,
                f"on sale {v['stock']}, held {v['held']}, sold {v['sold']}, stocked {v['stocked']}",
            )
    states = Counter(c["state"] for c in coupons)
    table.add_row("coupons (this run)", ", ".join(f"{s} {n}" for s, n in sorted(states.items())))
    sent = sum(1 for v in views.values() if told(v))
    table.add_row("order-closed notices sent (this run)", str(sent))
    table.add_row(
        "requests sent again under their key",
        f"{len(floor.repeats)} (answered the first order: {sum(floor.repeats)})",
    )
    demo_http.add_server_rows(table, summary, floor.refused)
    return table
