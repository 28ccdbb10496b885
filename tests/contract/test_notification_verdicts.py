"""A verified notification the database cannot apply is our trouble, not a forged one: its
verdict is ``error`` (the provider retries, the error alerts fire), never ``rejected`` (found in
review of issue 9). The provider here is a stand-in that vouches for what the test says; the
notification path and the databases are the real ones."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select

from dueflow.payments.base import (
    CloseOutcome,
    NotificationEvent,
    PaymentProvider,
    ProviderNotification,
    Providers,
)
from dueflow.payments.manual import ManualProvider
from dueflow.service import notifications, orders
from dueflow.store import payments as payment_store
from dueflow.store import schema
from tests.conftest import World


class Vouching(PaymentProvider):
    """Says every notification is a payment of the attempt, with a trade number too long for
    its column."""

    name = "vouching"

    async def close_or_query(self, attempt, now):  # type: ignore[no-untyped-def]
        return CloseOutcome.unknown("not asked")

    def verify_notification(self, body, headers, now):  # type: ignore[no-untyped-def]
        return ProviderNotification(
            NotificationEvent.PAID, "P-long", amount=Decimal("12.50"), provider_trade_no="T" * 200
        )


async def test_a_payment_the_database_cannot_store_is_an_error_not_a_rejection(
    backend_world: World,
) -> None:
    world = backend_world
    if world.deps.db.dialect == "sqlite":
        pytest.skip("SQLite stores text of any length: nothing is refused")
    world.deps.providers = Providers([ManualProvider(), Vouching()])
    goods_id = await world.goods()
    order_id = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    async with world.deps.db.write() as conn:
        await payment_store.insert_attempt(
            conn,
            pay_no="P-long",
            order_id=order_id,
            provider="vouching",
            amount=Decimal("12.50"),
            expires_at=world.clock.now() + timedelta(minutes=30),
            now=world.clock.now(),
        )
    receipt = await notifications.receive(world.deps, "vouching", b"{}", {})
    assert (receipt.accepted, receipt.outcome) == (False, "error")
    async with world.deps.db.read() as conn:
        inbox = (await conn.execute(select(schema.notifications))).one()
        status = (
            await conn.execute(select(schema.orders.c.status).where(schema.orders.c.id == order_id))
        ).scalar_one()
    assert inbox.outcome == "error" and "unstorable_value" in inbox.error
    assert status == "pending_payment"  # nothing of the payment was applied
