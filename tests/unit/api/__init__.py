"""The JSON API in process: an app built from the routes and the error handler alone, called over
httpx.ASGITransport, with a fake provider that starts payments and answers refunds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import update

from dueflow.api import (
    admin,
    errors,
    events,
    goods,
    keys,
    lists,
    orders,
    refunds,
    shop,
    shows,
    tickets,
    webhooks,
)
from dueflow.payments.base import (
    Attempt,
    CloseOutcome,
    PaymentProvider,
    PayStart,
    Providers,
    RefundOutcome,
    RefundRequest,
    RefundResult,
    VerifiedPayment,
)
from dueflow.payments.manual import ManualProvider
from dueflow.service import accounts
from dueflow.service import keys as service_keys
from dueflow.service import payments as payment_service
from dueflow.service.deps import Deps
from dueflow.store import schema
from tests.conftest import table_snapshot


class FakePay(PaymentProvider):
    """Starts trades with a made-up URL; answers refunds from ``refund_answers`` (then succeeds)."""

    name = "fakepay"

    def __init__(self) -> None:
        self.refund_answers: list[RefundResult] = []

    async def start(self, attempt: Attempt, *, subject: str) -> PayStart:
        return PayStart(f"https://pay.example/{attempt.pay_no}")

    async def close_or_query(self, attempt, now) -> CloseOutcome:
        return CloseOutcome.closed("fake")

    async def refund(self, request: RefundRequest) -> RefundOutcome:
        result = self.refund_answers.pop(0) if self.refund_answers else RefundResult.SUCCEEDED
        return RefundOutcome(result, f"fake {result.value}")


@dataclass
class Api:
    """The app's client, the deps below it, and four callers' tokens."""

    deps: Deps
    client: httpx.AsyncClient
    provider: FakePay
    tokens: dict[str, str] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)

    def auth(self, who: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}

    async def service_key(self, *scopes: str) -> str:
        """The secret of a service key with ``scopes`` (one per set of scopes, made on first
        use by the CLI's hand)."""
        label = " ".join(sorted(scopes))
        if label not in self.secrets:
            _, self.secrets[label] = await service_keys.add_key(
                self.deps, name=f"test {label}", scopes=scopes, expires_at=None, by="cli"
            )
        return self.secrets[label]

    async def host_id(self, who: str) -> str:
        """The host's id of the user ``who`` (``host-<who>``), given to that user on first use,
        so that a key acting for it acts for the same user as ``who``'s token."""
        external_id = f"host-{who}"
        async with self.deps.db.write() as conn:
            await conn.execute(
                update(schema.users)
                .where(schema.users.c.id == self.ids[who])
                .values(external_id=external_id)
            )
        return external_id

    async def as_key(self, scope: str, who: str | None, name: str | None = None) -> dict[str, str]:
        """Headers of a service key with ``scope`` acting for ``who`` (nobody when None)."""
        headers = {"Authorization": f"Bearer {await self.service_key(scope)}"}
        if who is not None:
            headers["Dueflow-Act-As"] = await self.host_id(who)
        if name is not None:
            headers["Dueflow-Act-As-Name"] = name
        return headers

    async def call(self, method: str, url: str, who: str | None, **kwargs: Any) -> httpx.Response:
        headers = {**self.auth(who), **kwargs.pop("headers", {})}
        return await self.client.request(method, url, headers=headers, **kwargs)

    async def goods(self, price: str = "12.50") -> int:
        answer = await self.call(
            "POST", "/api/goods", "seller", json={"title": "tent", "price": price}
        )
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    async def show(self, seats: str = "A-1 A-2 A-3 B-1 B-2", limit: int = 4) -> int:
        """A show by the seller, on sale for 29 days; A seats at 380, B seats at 180."""
        now = self.deps.clock.now()
        body = {
            "title": "Winter concert",
            "venue": "Hall 1",
            "starts_at": (now + timedelta(days=30)).isoformat(),
            "sales_close_at": (now + timedelta(days=29)).isoformat(),
            "seat_limit": limit,
            "seats": [
                {"label": label, "price": "380.00" if label.startswith("A") else "180.00"}
                for label in seats.split()
            ],
        }
        answer = await self.call("POST", "/api/shows", "seller", json=body)
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    async def ticket_order(self, show_id: int, seats: list[str], who: str = "buyer") -> int:
        answer = await self.call(
            "POST", "/api/orders", who, json={"show_id": show_id, "seats": seats}
        )
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    async def paid_ticket(self, show_id: int, seat: str, who: str = "buyer") -> str:
        """The code of the ticket of ``seat``, bought by ``who`` and paid (recorded by hand)."""
        order_id = await self.ticket_order(show_id, [seat], who)
        price = "380.00" if seat.startswith("A") else "180.00"
        await payment_service.record_manual_payment(self.deps, order_id=order_id, amount=price)
        answer = await self.call("GET", f"/api/orders/{order_id}", who)
        return str(answer.json()["tickets"][0]["code"])

    async def order(self) -> int:
        goods_id = await self.goods()
        answer = await self.call("POST", "/api/orders", "buyer", json={"goods_id": goods_id})
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    async def paid_order(self) -> int:
        """An order paid through the fake provider (as if its notification arrived)."""
        order_id = await self.order()
        answer = await self.call(
            "POST", f"/api/orders/{order_id}/payments", "buyer", json={"provider": "fakepay"}
        )
        assert answer.status_code == 201, answer.text
        payment = VerifiedPayment(pay_no=answer.json()["pay_no"], amount=Decimal("12.50"))
        await payment_service.confirm_payment(self.deps, payment, actor="fakepay")
        return order_id

    async def shipped(self) -> int:
        """A paid order its seller shipped."""
        order_id = await self.paid_order()
        answer = await self.call(
            "POST",
            f"/api/orders/{order_id}/ship",
            "seller",
            json={"carrier": "SF", "tracking_no": "1"},
        )
        assert answer.status_code == 200, answer.text
        return order_id

    async def received(self) -> int:
        """A shipped order its buyer confirmed."""
        order_id = await self.shipped()
        answer = await self.call("POST", f"/api/orders/{order_id}/confirm-receipt", "buyer")
        assert answer.status_code == 200, answer.text
        return order_id

    async def overdue_timer(self) -> int:
        """A new order's cancel_unpaid timer, its deadline a minute past (as if missed)."""
        order_id = await self.order()
        past = self.deps.clock.now() - timedelta(minutes=1)
        async with self.deps.db.write() as conn:
            result = await conn.execute(
                update(schema.timers)
                .where(
                    schema.timers.c.order_id == order_id, schema.timers.c.kind == "cancel_unpaid"
                )
                .values(deadline_at=past, due_at=past)
                .returning(schema.timers.c.id)
            )
            return int(result.scalar_one())

    # --- the shop

    async def sku(self, stock: int = 10, price: str = "25.00", who: str = "seller") -> int:
        """A SKU of ``who`` (the seller) with ``stock`` units on sale."""
        answer = await self.call(
            "POST", "/api/skus", who, json={"title": "mug", "price": price, "stock": stock}
        )
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    async def coupon_template(
        self, off: str = "5.00", minimum: str = "20.00", total: int = 10
    ) -> int:
        """A coupon template of the seller's, valid from now for 30 days."""
        now = self.deps.clock.now()
        body = {
            "title": f"{off} off",
            "amount_off": off,
            "min_amount": minimum,
            "valid_from": now.isoformat(),
            "valid_until": (now + timedelta(days=30)).isoformat(),
            "total": total,
        }
        answer = await self.call("POST", "/api/coupon-templates", "seller", json=body)
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    async def coupon(self, to: str = "buyer", off: str = "5.00", minimum: str = "20.00") -> int:
        """A coupon of a new template of the seller's, issued to ``to``."""
        template_id = await self.coupon_template(off, minimum)
        answer = await self.call(
            "POST",
            f"/api/coupon-templates/{template_id}/issue",
            "seller",
            json={"user_id": self.ids[to]},
        )
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    async def flash_sale(
        self, sku_id: int | None = None, stock: int = 5, price: str = "9.90", limit: int = 1
    ) -> int:
        """A flash sale of the seller's SKU (a new one if not given), open for an hour."""
        sku_id = await self.sku() if sku_id is None else sku_id
        now = self.deps.clock.now()
        body = {
            "sku_id": sku_id,
            "price": price,
            "stock": stock,
            "starts_at": now.isoformat(),
            "ends_at": (now + timedelta(hours=1)).isoformat(),
            "per_buyer_limit": limit,
        }
        answer = await self.call("POST", "/api/flash-sales", "seller", json=body)
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    async def shop_order(
        self, lines: dict[int, int] | None = None, coupon: int | None = None, who: str = "buyer"
    ) -> int:
        """A shop order of ``who``: units per SKU (two units of a new SKU if not given), and a
        coupon."""
        lines = {await self.sku(): 2} if lines is None else lines
        body: dict[str, Any] = {"lines": [{"sku_id": k, "quantity": q} for k, q in lines.items()]}
        if coupon is not None:
            body["coupon_id"] = coupon
        answer = await self.call("POST", "/api/orders", who, json=body)
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    async def refund(self) -> int:
        """A refund awaiting review: a paid order cancelled by its seller."""
        order_id = await self.paid_order()
        answer = await self.call("POST", f"/api/orders/{order_id}/cancel", "seller")
        assert answer.status_code == 200, answer.text
        [refund] = answer.json()["refunds"]
        return int(refund["id"])


def build_app(deps: Deps) -> FastAPI:
    app = FastAPI()
    errors.install(app)
    app.include_router(goods.router(deps))
    app.include_router(orders.router(deps))
    app.include_router(admin.router(deps))
    app.include_router(lists.router(deps))
    app.include_router(events.router(deps))
    app.include_router(refunds.router(deps))
    app.include_router(keys.router(deps))
    app.include_router(shows.router(deps))
    app.include_router(tickets.router(deps))
    app.include_router(shop.router(deps))
    app.include_router(webhooks.router(deps))
    return app


@asynccontextmanager
async def running_api(deps: Deps) -> AsyncIterator[Api]:
    provider = FakePay()
    deps.providers = Providers([ManualProvider(), provider])
    transport = httpx.ASGITransport(app=build_app(deps))
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        api = Api(deps, client, provider)
        for role, admin in [("seller", False), ("buyer", False), ("stranger", False)]:
            user, token = await accounts.add_user(deps, f"api-{role}", admin=admin)
            api.tokens[role], api.ids[role] = token, user.id
        user, token = await accounts.add_user(deps, "api-admin", admin=True)
        api.tokens["admin"], api.ids["admin"] = token, user.id
        yield api


__all__ = ["Api", "build_app", "running_api", "table_snapshot"]
