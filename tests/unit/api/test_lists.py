"""The lists over HTTP: GET /api/goods, /api/orders and /api/me. A walk by cursor shows every row
once, newest first; filters, limit bounds, bad cursors (422, nothing changed) and who sees what."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import update

from dueflow.service import lists
from dueflow.store import schema
from tests.unit.api import Api, running_api, table_snapshot


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    async with running_api(world.deps) as api:
        yield api


async def walk(api: Api, who: str, path: str, **params: Any) -> list[list[int]]:
    """Every page of the list at ``path`` as ``who``: the ids of each page, in order."""
    pages: list[list[int]] = []
    after = None
    while True:
        query = {**params, **({"after": after} if after else {})}
        answer = await api.call("GET", path, who, params=query)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert set(body) == {"items", "next"}
        pages.append([item["id"] for item in body["items"]])
        after = body["next"]
        if after is None:
            return pages
        assert len(pages) < 1000, "the walk does not end"


def flat(pages: list[list[int]]) -> list[int]:
    return [i for page in pages for i in page]


async def goods_of(api: Api, who: str, count: int) -> list[int]:
    ids = []
    for n in range(count):
        answer = await api.call(
            "POST", "/api/goods", who, json={"title": f"item {n}", "price": "1.00"}
        )
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    return ids


async def order_as(api: Api, who: str, goods_id: int) -> int:
    answer = await api.call("POST", "/api/orders", who, json={"goods_id": goods_id})
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


async def set_goods_status(api: Api, goods_id: int, status: str) -> None:
    async with api.deps.db.write() as conn:
        await conn.execute(
            update(schema.goods).where(schema.goods.c.id == goods_id).values(status=status)
        )


# --- goods ----------------------------------------------------------------------------------


async def test_a_walk_shows_every_goods_on_sale_once_newest_first(api):
    on_sale = await goods_of(api, "seller", 9) + await goods_of(api, "stranger", 4)
    held = await api.order()  # held goods are still on sale, shown with their order
    sold_order = await api.paid_order()
    off = on_sale.pop(0)
    await set_goods_status(api, off, "off_sale")
    held_goods = (await api.call("GET", f"/api/orders/{held}", "buyer")).json()["goods_id"]
    sold_goods = (await api.call("GET", f"/api/orders/{sold_order}", "buyer")).json()["goods_id"]

    pages = await walk(api, "buyer", "/api/goods", limit=4)

    expected = sorted([*on_sale, held_goods], reverse=True)
    assert flat(pages) == expected
    assert [len(p) for p in pages] == [4, 4, 4, 1]
    assert off not in flat(pages) and sold_goods not in flat(pages)
    first = (await api.call("GET", "/api/goods", "buyer", params={"limit": 100})).json()
    shown = {item["id"]: item for item in first["items"]}
    assert shown[held_goods]["reserved_order_id"] == held
    assert shown[held_goods]["status"] == "on_sale"
    assert first["next"] is None


async def test_a_sellers_own_goods_come_in_every_status_anyone_elses_only_on_sale(api):
    mine = await goods_of(api, "seller", 3)
    theirs = await goods_of(api, "stranger", 2)
    await set_goods_status(api, mine[0], "off_sale")
    await set_goods_status(api, mine[1], "sold")
    await set_goods_status(api, theirs[0], "off_sale")
    seller = api.ids["seller"]

    own = flat(await walk(api, "seller", "/api/goods", seller_id=seller, limit=2))
    seen_by_buyer = flat(await walk(api, "buyer", "/api/goods", seller_id=seller, limit=2))
    strangers = flat(await walk(api, "seller", "/api/goods", seller_id=api.ids["stranger"]))

    assert own == sorted(mine, reverse=True)
    assert seen_by_buyer == [mine[2]]
    assert strangers == [theirs[1]]


async def test_goods_of_a_seller_without_any_is_an_empty_last_page(api):
    await goods_of(api, "seller", 2)
    answer = await api.call("GET", "/api/goods", "buyer", params={"seller_id": api.ids["buyer"]})
    assert answer.json() == {"items": [], "next": None}


# --- orders ---------------------------------------------------------------------------------


async def test_a_buyer_never_sees_another_buyers_orders(api):
    goods = await goods_of(api, "seller", 7)
    buyers = [await order_as(api, "buyer", g) for g in goods[:4]]
    strangers = [await order_as(api, "stranger", g) for g in goods[4:]]

    as_buyer = await walk(api, "buyer", "/api/orders", limit=3)
    as_stranger = await walk(api, "stranger", "/api/orders", limit=3)
    as_seller = await walk(api, "seller", "/api/orders", role="seller", limit=3)
    # A filter the API does not have is not a way round it.
    other = {"buyer_id": api.ids["stranger"]}
    sneaky = await api.call("GET", "/api/orders", "buyer", params=other)

    assert flat(as_buyer) == sorted(buyers, reverse=True)
    assert [len(p) for p in as_buyer] == [3, 1]
    assert flat(as_stranger) == sorted(strangers, reverse=True)
    assert flat(as_seller) == sorted(buyers + strangers, reverse=True)
    assert [o["id"] for o in sneaky.json()["items"]] == sorted(buyers, reverse=True)


async def test_an_admin_lists_only_their_own_orders(api):
    await api.order()
    assert flat(await walk(api, "admin", "/api/orders")) == []
    assert flat(await walk(api, "admin", "/api/orders", role="seller")) == []


async def test_a_buyer_has_no_orders_as_seller(api):
    await api.order()
    answer = await api.call("GET", "/api/orders", "buyer", params={"role": "seller"})
    assert answer.json() == {"items": [], "next": None}


async def test_orders_by_status_and_flow(api):
    unpaid = [await api.order() for _ in range(3)]
    paid = [await api.paid_order() for _ in range(2)]
    everything = sorted(unpaid + paid, reverse=True)

    pending = await walk(api, "buyer", "/api/orders", status="pending_payment", limit=2)
    shipping = await walk(api, "seller", "/api/orders", role="seller", status="pending_shipment")
    flow = await walk(api, "buyer", "/api/orders", flow="marketplace", limit=2)
    both = await walk(api, "buyer", "/api/orders", flow="marketplace", status="pending_shipment")

    assert flat(pending) == sorted(unpaid, reverse=True)
    assert flat(shipping) == sorted(paid, reverse=True)
    assert flat(flow) == everything
    assert flat(both) == sorted(paid, reverse=True)


async def test_an_order_item_is_the_order_without_its_nested_lists(api):
    order_id = await api.order()
    [item] = (await api.call("GET", "/api/orders", "buyer")).json()["items"]
    whole = (await api.call("GET", f"/api/orders/{order_id}", "buyer")).json()
    nested = {
        "lines",
        "tickets",
        "payments",
        "refunds",
        "reviews",
        "timers",
        "notices",
        "timeline",
    }
    assert item == {k: v for k, v in whole.items() if k not in nested}
    assert item["flow"] == "marketplace" and item["amount"] == "12.50"


async def test_an_unknown_flow_or_status_is_refused(api):
    await api.order()
    for params in ({"flow": "lottery"}, {"status": "lost"}, {"role": "admin"}):
        answer = await api.call("GET", "/api/orders", "buyer", params=params)
        assert answer.status_code == 422, (params, answer.text)
        assert answer.json()["error"]["code"] == "invalid_input"
    flow = await api.call("GET", "/api/orders", "buyer", params={"flow": "lottery"})
    assert (
        "unknown flow 'lottery' (known: marketplace, shop, tickets)"
        in flow.json()["error"]["message"]
    )


# --- inserts during a walk ------------------------------------------------------------------


async def test_rows_inserted_during_a_walk_neither_repeat_nor_push_others_out(api):
    before = await goods_of(api, "seller", 10)
    orders_before = [await order_as(api, "buyer", g) for g in before[:6]]
    walks = {"/api/goods": Walk(3), "/api/orders": Walk(2)}
    while not all(w.done for w in walks.values()):
        for path, walk_ in walks.items():
            if not walk_.done:
                answer = await api.call("GET", path, "buyer", params=walk_.params())
                walk_.take(answer.json())
        # Between pages, new goods and new orders (held goods stay on sale: still listed).
        [new] = await goods_of(api, "seller", 1)
        await order_as(api, "buyer", new)
    assert walks["/api/goods"].ids == sorted(before, reverse=True)
    assert walks["/api/orders"].ids == sorted(orders_before, reverse=True)


class Walk:
    """A walk through one list, a page at a time."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.after: str | None = None
        self.ids: list[int] = []
        self.done = False

    def params(self) -> dict[str, Any]:
        return {"limit": self.limit, **({"after": self.after} if self.after else {})}

    def take(self, page: dict[str, Any]) -> None:
        self.ids += [item["id"] for item in page["items"]]
        self.after = page["next"]
        self.done = self.after is None


# --- limits and cursors ---------------------------------------------------------------------


async def test_the_limit_defaults_to_twenty_and_stops_at_a_hundred(api):
    await goods_of(api, "seller", 101)
    default = (await api.call("GET", "/api/goods", "buyer")).json()
    most = (await api.call("GET", "/api/goods", "buyer", params={"limit": 100})).json()
    one = (await api.call("GET", "/api/goods", "buyer", params={"limit": 1})).json()
    assert len(default["items"]) == lists.DEFAULT_LIMIT == 20 and default["next"]
    assert len(most["items"]) == 100 and most["next"]
    assert len(one["items"]) == 1 and one["next"]
    rest = await api.call("GET", "/api/goods", "buyer", params={"after": most["next"]})
    assert len(rest.json()["items"]) == 1 and rest.json()["next"] is None
    for path in ("/api/goods", "/api/orders"):
        for limit in ("101", "0", "-1", "many", "1.5"):
            answer = await api.call("GET", path, "buyer", params={"limit": limit})
            assert answer.status_code == 422, (path, limit, answer.text)
            assert answer.json()["error"]["code"] == "invalid_input"


def forged(value: Any) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


async def test_bad_cursors_are_refused_without_changing_a_row(api):
    await goods_of(api, "seller", 3)
    [await api.order() for _ in range(3)]
    goods_next = (await api.call("GET", "/api/goods", "buyer", params={"limit": 1})).json()["next"]
    orders_next = (await api.call("GET", "/api/orders", "buyer", params={"limit": 1})).json()[
        "next"
    ]
    pending = {"limit": 1, "status": "pending_payment"}
    pending_next = (await api.call("GET", "/api/orders", "buyer", params=pending)).json()["next"]
    scope = {"list": "goods", "seller_id": None, "own": False}
    not_a_cursor = [
        "!!!",
        "a b",
        "x" * 401,
        "abc",  # not base64 of anything
        forged(b"\xff\xfe"),  # not text
        forged(b"{not json"),
        forged([1, 2]),
        forged({"after": 2}),
        forged({"after": 0, "for": scope}),
        forged({"after": -5, "for": scope}),
        forged({"after": True, "for": scope}),
        forged({"after": "2", "for": scope}),
        forged({"after": 2**63, "for": scope}),
        forged({"after": 2, "for": scope, "more": 1}),
    ]
    other_filters = [
        ("/api/orders", "buyer", {"after": goods_next}),  # a goods cursor for orders
        ("/api/goods", "buyer", {"after": orders_next}),
        ("/api/goods", "buyer", {"after": goods_next, "seller_id": api.ids["seller"]}),
        ("/api/goods", "seller", {"after": goods_next, "seller_id": api.ids["seller"]}),
        ("/api/orders", "buyer", {"after": orders_next, "role": "seller"}),
        ("/api/orders", "buyer", {"after": orders_next, "status": "pending_payment"}),
        ("/api/orders", "buyer", {"after": pending_next}),  # made with a status, used without
        ("/api/orders", "buyer", {"after": orders_next, "flow": "marketplace"}),
        ("/api/orders", "stranger", {"after": orders_next}),  # someone else's cursor
    ]
    before = await table_snapshot(api.deps)
    for bad in not_a_cursor:
        for path in ("/api/goods", "/api/orders"):
            answer = await api.call("GET", path, "buyer", params={"after": bad})
            assert answer.status_code == 422, (path, bad, answer.text)
            assert answer.json()["error"]["code"] == "invalid_input"
    for path, who, params in other_filters:
        answer = await api.call("GET", path, who, params=params)
        assert answer.status_code == 422, (path, who, params, answer.text)
        assert "made for other filters" in answer.json()["error"]["message"]
    assert await table_snapshot(api.deps) == before
    # The same cursors, used as given, are good.
    for path, after in (("/api/goods", goods_next), ("/api/orders", orders_next)):
        answer = await api.call("GET", path, "buyer", params={"after": after, "limit": 1})
        assert answer.status_code == 200, answer.text


async def test_a_cursor_is_urlsafe_text_that_names_no_row_in_the_clear(api):
    await goods_of(api, "seller", 3)
    answer = (await api.call("GET", "/api/goods", "buyer", params={"limit": 1})).json()
    assert answer["next"].replace("-", "").replace("_", "").isalnum()
    assert "after" not in answer["next"]


# --- me -------------------------------------------------------------------------------------


async def test_me_says_who_the_caller_is_and_counts_their_orders(api):
    await api.order()
    await api.paid_order()
    [goods] = await goods_of(api, "buyer", 1)  # the buyer sells too
    await order_as(api, "stranger", goods)

    buyer = (await api.call("GET", "/api/me", "buyer")).json()
    seller = (await api.call("GET", "/api/me", "seller")).json()
    admin = (await api.call("GET", "/api/me", "admin")).json()

    assert buyer == {
        "id": api.ids["buyer"],
        "name": "api-buyer",
        "admin": False,
        "orders_as_buyer": 2,
        "orders_as_seller": 1,
    }
    assert (seller["orders_as_buyer"], seller["orders_as_seller"]) == (0, 2)
    assert admin["admin"] is True and admin["name"] == "api-admin"
    assert (admin["orders_as_buyer"], admin["orders_as_seller"]) == (0, 0)


async def test_the_lists_need_a_token(api):
    for path in ("/api/goods", "/api/orders", "/api/me"):
        answer = await api.call("GET", path, None)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "unauthorized"
