"""The hot paths' statements, pinned: placing an order of every flow and the order view, through
the whole app, on every backend (SQLite here; PostgreSQL and MariaDB under their markers). A
count that grows is a regression to explain (``benchmarks/statements.py`` prints them all).

Also: authentication reads the caller once and placing does not read the buyer again; without
an Idempotency-Key no idempotency statement runs; a new order's answer, built from what its
transaction wrote, is what the order view reads of it; the hot statements compile once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.engine.default import CACHE_MISS

from dueflow.api import common
from dueflow.exceptions import NotFound
from dueflow.service import orders, shop, tickets
from tests.unit.api import Api
from tests.unit.api.shop_world import new_coupon, new_flash_sale, new_sku, shop_api

#: Statements, transactions begun and write transactions committed per request, on every
#: backend. Placing: the caller's token (1), what is bought (goods 1, a show 1 and its seats with their holds 1,
#: SKUs 1, a coupon 1, a flash sale with its SKU's title 1, read before the write transaction
#: so that a sale out of units is refused by that read alone), the buyer's per-show or
#: per-sale count (2; a flash sale's take answers its limit, where the dialect has UPDATE ...
#: RETURNING: MariaDB reads it, one more), the order, its lines, each
#: hold, its timers (one INSERT) and its event. The view is the order and its eight kinds of
#: rows (nine with a show's tickets). Placing goods by a personal token reads the token in the
#: placing transaction (api/hot_place.py): one transaction, where the other flows have two.
EXPECTED = {
    "place goods": (7, 1, 1),
    "place goods with an Idempotency-Key": (10, 3, 1),
    "place seats": (10, 2, 1),
    "place SKU lines": (8, 2, 1),
    "place SKU lines with a coupon": (10, 2, 1),
    "place flash sale": (10, 3, 1),
    "order view": (9, 2, 0),
    "order view of a show's order": (10, 2, 0),
}


@dataclass
class Sent:
    """What one request sent to the database."""

    statements: list[str] = field(default_factory=list)
    transactions: int = 0
    writes: int = 0
    misses: int = 0

    def counts(self) -> tuple[int, int, int]:
        return len(self.statements), self.transactions, self.writes


class Counting:
    """SQLAlchemy's engine events, counted into :attr:`sent` (SQLite's own BEGIN is none)."""

    def __init__(self, api: Api) -> None:
        self.sent = Sent()
        self.engine = api.deps.db.engine.sync_engine
        self.hooks: list[tuple[str, Callable[..., None]]] = [
            ("before_cursor_execute", self._statement),
            ("begin", self._begin),
            ("commit", self._commit),
        ]
        for name, hook in self.hooks:
            event.listen(self.engine, name, hook)

    def close(self) -> None:
        for name, hook in self.hooks:
            event.remove(self.engine, name, hook)

    def _statement(self, conn: Any, cursor: Any, sql: str, *rest: Any) -> None:
        if not sql.startswith("BEGIN"):
            self.sent.statements.append(sql)
            if rest[1] is not None and rest[1].cache_hit is CACHE_MISS:
                self.sent.misses += 1

    def _begin(self, conn: Any) -> None:
        self.sent.transactions += 1

    def _commit(self, conn: Any) -> None:
        if not conn.get_execution_options().get("dueflow_read"):
            self.sent.writes += 1

    async def __call__(self, request: Awaitable[httpx.Response]) -> tuple[httpx.Response, Sent]:
        self.sent = Sent()
        answer = await request
        assert answer.status_code in (200, 201), answer.text
        return answer, self.sent


@dataclass
class Paths:
    """Each hot path as a request for something new each time."""

    api: Api
    show_id: int
    skus: list[int]
    sale_id: int
    seats: list[str]
    keys: int = 0

    # Each makes what it buys first, and returns the request itself, not yet sent.

    async def goods(self, headers: dict[str, str] | None = None) -> Awaitable[httpx.Response]:
        body = {"goods_id": await self.api.goods()}
        return self.api.call("POST", "/api/orders", "buyer", json=body, headers=headers or {})

    async def keyed(self) -> Awaitable[httpx.Response]:
        self.keys += 1
        return await self.goods({"Idempotency-Key": f"key-{self.keys}"})

    async def seat(self) -> Awaitable[httpx.Response]:
        body = {"show_id": self.show_id, "seats": [self.seats.pop(0)]}
        return self.api.call("POST", "/api/orders", "buyer", json=body)

    async def lines(self) -> Awaitable[httpx.Response]:
        body = {"lines": [{"sku_id": s, "quantity": 1} for s in self.skus]}
        return self.api.call("POST", "/api/orders", "buyer", json=body)

    async def coupon(self) -> Awaitable[httpx.Response]:
        body = {
            "lines": [{"sku_id": s, "quantity": 1} for s in self.skus],
            "coupon_id": await new_coupon(self.api),
        }
        return self.api.call("POST", "/api/orders", "buyer", json=body)

    async def flash(self) -> Awaitable[httpx.Response]:
        body = {"flash_sale_id": self.sale_id, "quantity": 1}
        return self.api.call("POST", "/api/orders", "buyer", json=body)

    def requests(self) -> dict[str, Callable[[], Awaitable[Awaitable[httpx.Response]]]]:
        return {
            "place goods": self.goods,
            "place goods with an Idempotency-Key": self.keyed,
            "place seats": self.seat,
            "place SKU lines": self.lines,
            "place SKU lines with a coupon": self.coupon,
            "place flash sale": self.flash,
        }


@pytest.fixture
async def api(backend_world: Any) -> AsyncIterator[Api]:
    async with shop_api(backend_world.deps) as api:
        yield api


@pytest.fixture
async def paths(api: Api) -> Paths:
    show_id = await api.show(" ".join(f"A-{i}" for i in range(1, 9)), limit=8)
    skus = [await new_sku(api, stock=100), await new_sku(api, stock=100)]
    sale_id = await new_flash_sale(api, skus[0], stock=50, limit=50)
    return Paths(api, show_id, skus, sale_id, [f"A-{i}" for i in range(1, 9)])


async def test_each_hot_path_sends_its_pinned_statements(api, paths, backend_world):
    expected = dict(EXPECTED)
    if not backend_world.deps.db.engine.dialect.update_returning:
        expected["place flash sale"] = (11, 3, 1)
    counting = Counting(api)
    try:
        found = {}
        placed = []
        for name, request in paths.requests().items():
            for _ in range(2):  # the second one is counted: statements compiled by then
                answer, sent = await counting(await request())
            found[name] = sent.counts()
            placed.append(answer.json()["id"])
        for name, order_id in zip(EXPECTED, placed, strict=False):
            _, sent = await counting(api.call("GET", f"/api/orders/{order_id}", "buyer"))
            view = "order view of a show's order" if "seats" in name else "order view"
            found[view] = sent.counts()
            assert found[view] == expected[view], (name, sent.statements)
    finally:
        counting.close()
    assert found == expected


async def test_hot_statements_compile_once(api, paths):
    """Built the same way every time, the statements come from SQLAlchemy's compiled cache."""
    counting = Counting(api)
    try:
        for request in paths.requests().values():
            await counting(await request())
            _, sent = await counting(await request())
            assert sent.misses == 0, sent.statements
    finally:
        counting.close()


async def test_placing_reads_the_caller_once_and_no_key_means_no_key_statement(api, paths):
    counting = Counting(api)
    try:
        for name, request in paths.requests().items():
            _, sent = await counting(await request())
            from_users = [s for s in sent.statements if "FROM users" in s]
            assert len(from_users) == 1, (name, sent.statements)
            assert "token_hash" in sent.statements[0], sent.statements  # authentication
            keyed = [s for s in sent.statements if "idempotency_keys" in s]
            assert bool(keyed) == ("Idempotency-Key" in name), (name, sent.statements)
    finally:
        counting.close()


async def test_a_new_orders_answer_is_its_order_view(api, paths):
    """The answer built from what the placing transaction wrote is what a read gives back,
    on every backend, also when the clock is not on UTC and has microseconds."""
    for name, request in paths.requests().items():
        plus_eight = timezone(timedelta(hours=8))
        api.deps.clock.set(
            (api.deps.clock.now() + timedelta(seconds=1, microseconds=123_457)).astimezone(
                plus_eight
            )
        )
        placed = await (await request())
        assert placed.status_code == 201, placed.text
        view = await api.call("GET", f"/api/orders/{placed.json()['id']}", "buyer")
        assert view.status_code == 200, view.text
        assert placed.json() == view.json(), name
        assert placed.json()["created_at"] == api.deps.clock.now().astimezone(UTC).isoformat()


async def test_a_key_acting_for_a_host_user_costs_what_a_personal_token_costs(api, paths):
    """Placing goods by a service key acting for a host user sends the statements and commits a
    personal token's request sends: one statement reads the key and the user acted for together
    (the LEFT JOIN on users.external_id), in a read transaction of its own (a token's is read in
    the placing transaction). Its first use makes the user: one INSERT in one write transaction
    more, once per user."""
    secret = await api.service_key("orders")
    counting = Counting(api)
    try:
        for n in range(3):
            body = {"goods_id": await api.goods()}
            headers = {"Authorization": f"Bearer {secret}", "Dueflow-Act-As": "host-buyer-1"}
            _, sent = await counting(
                api.call("POST", "/api/orders", None, json=body, headers=headers)
            )
            statements, transactions, writes = EXPECTED["place goods"]
            expected = (statements, transactions + 1, writes)
            if n == 0:  # the user is made
                expected = (expected[0] + 1, expected[1] + 1, expected[2] + 1)
                assert "INSERT INTO users" in sent.statements[1], sent.statements
            if n > 0:  # compiled by then: the same statements as a personal token's
                assert "api_keys" in sent.statements[0] and "users" in sent.statements[0]
            assert sent.counts() == expected, (n, sent.statements)
    finally:
        counting.close()


@pytest.mark.parametrize("flow", ["goods", "seats", "lines", "flash"])
async def test_placing_without_an_authenticated_buyer_still_finds_no_user(api, paths, flow):
    """Callers other than the API (the command line, demos) do not vouch for the buyer:
    placing reads it, and an unknown one is NotFound."""
    deps = api.deps
    placing = {
        "goods": lambda: orders.place_order(deps, buyer_id=4242, goods_id=goods_id),
        "seats": lambda: tickets.place_ticket_order(
            deps, buyer_id=4242, show_id=paths.show_id, labels=["A-1"]
        ),
        "lines": lambda: shop.place_shop_order(
            deps, buyer_id=4242, lines=[{"sku_id": paths.skus[0], "quantity": 1}]
        ),
        "flash": lambda: shop.place_flash_order(
            deps, buyer_id=4242, flash_sale_id=paths.sale_id, quantity=1
        ),
    }
    goods_id = await api.goods()
    with pytest.raises(NotFound, match="no user 4242"):
        await placing[flow]()


def test_the_answer_is_encoded_once_as_before():
    """orjson in one pass writes what the old two passes did: Decimals as exact strings,
    datetimes in ISO 8601 with their offset and microseconds, other keys as text."""
    when = datetime(2026, 3, 1, 12, 0, 0, 5, tzinfo=UTC)
    value = {
        "amount": Decimal("12.50"),
        "at": when,
        "local": when.astimezone(timezone(timedelta(hours=8))),
        "day": when.date(),
        7: ("A-1", Decimal("0.01")),
        "text": "风筝 \u200f",
        "none": None,
    }
    old = {
        "amount": "12.50",
        "at": when.isoformat(),
        "local": when.astimezone(timezone(timedelta(hours=8))).isoformat(),
        "day": when.date().isoformat(),
        "7": ["A-1", "0.01"],
        "text": "风筝 \u200f",
        "none": None,
    }
    assert (
        common.encode(value) == json.dumps(old, ensure_ascii=False, separators=(",", ":")).encode()
    )
