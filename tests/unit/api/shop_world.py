"""The shop's HTTP world: the whole app (``dueflow.api.app``, its shop routes included) in
process, and small helpers that create SKUs, coupons and flash sales through it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import func, select

from dueflow.api.app import create_app
from dueflow.payments.base import Providers
from dueflow.payments.manual import ManualProvider
from dueflow.service import accounts
from dueflow.service.deps import Deps
from dueflow.store.schema import orders
from tests.unit.api import Api, FakePay


@asynccontextmanager
async def shop_api(deps: Deps) -> AsyncIterator[Api]:
    """The whole app over ``deps`` with a seller, a buyer, a stranger and an admin."""
    provider = FakePay()
    deps.providers = Providers([ManualProvider(), provider])
    transport = httpx.ASGITransport(app=create_app(deps))
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        api = Api(deps, client, provider)
        for role, admin in [("seller", False), ("buyer", False), ("stranger", False)]:
            user, token = await accounts.add_user(deps, f"api-{role}", admin=admin)
            api.tokens[role], api.ids[role] = token, user.id
        user, token = await accounts.add_user(deps, "api-admin", admin=True)
        api.tokens["admin"], api.ids["admin"] = token, user.id
        yield api


def fails(answer: httpx.Response, status: int, code: str, words: str = "") -> None:
    """The answer is the error ``code`` with ``status``, its message naming ``words``."""
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == code, error
    assert words in error["message"], error


async def new_sku(api: Api, stock: int = 10, price: str = "25.00", who: str = "seller") -> int:
    answer = await api.call(
        "POST", "/api/skus", who, json={"title": "mug", "price": price, "stock": stock}
    )
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def window(
    api: Api, *, starts: timedelta = timedelta(0), lasts: timedelta = timedelta(days=7)
) -> tuple[str, str]:
    """A window from ``starts`` from now, ``lasts`` long, as ISO 8601 texts."""
    begin = api.deps.clock.now() + starts
    return begin.isoformat(), (begin + lasts).isoformat()


async def new_template(api: Api, **given: Any) -> dict[str, Any]:
    valid_from, valid_until = window(api)
    body = {
        "title": "5 off",
        "amount_off": "5.00",
        "min_amount": "20.00",
        "valid_from": valid_from,
        "valid_until": valid_until,
        "total": 10,
        **given,
    }
    answer = await api.call("POST", "/api/coupon-templates", "seller", json=body)
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


async def new_coupon(api: Api, to: str = "buyer", **given: Any) -> int:
    """A coupon of a new template of the seller's, issued to ``to``."""
    tpl = await new_template(api, **given)
    answer = await api.call(
        "POST",
        f"/api/coupon-templates/{tpl['id']}/issue",
        "seller",
        json={"user_id": api.ids[to]},
    )
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


async def new_flash_sale(
    api: Api,
    sku_id: int,
    *,
    stock: int,
    limit: int = 1,
    starts: timedelta = timedelta(0),
    price: str = "1.00",
) -> int:
    """A flash sale of the seller's SKU, an hour long from ``starts`` from now."""
    starts_at, ends_at = window(api, starts=starts, lasts=timedelta(hours=1))
    body = {
        "sku_id": sku_id,
        "price": price,
        "stock": stock,
        "starts_at": starts_at,
        "ends_at": ends_at,
        "per_buyer_limit": limit,
    }
    answer = await api.call("POST", "/api/flash-sales", "seller", json=body)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


async def sku_counts(api: Api, sku_id: int) -> tuple[int, int, int]:
    """The SKU's (stock, held, sold) as GET answers them; they add up to its stocked units."""
    answer = await api.call("GET", f"/api/skus/{sku_id}", "stranger")
    assert answer.status_code == 200, answer.text
    sku = answer.json()
    assert sku["stock"] + sku["held"] + sku["sold"] == sku["stocked"]
    return sku["stock"], sku["held"], sku["sold"]


async def order_count(api: Api) -> int:
    async with api.deps.db.read() as conn:
        return int(await conn.scalar(select(func.count()).select_from(orders)))
