"""The notify routes of the real app, fed fuzzed bodies and headers: every answer is a 4xx in the
provider's own terms (never a 5xx), and no row of any table changes but the inbox's own row for
the notification (kept raw by design, its verdict "rejected").

Every notification here names a trade dueflow never started, so even a correctly signed one must
be refused; a last control posts a valid one for a real attempt and sees it accepted.

Hypothesis runs in a worker thread; each example is posted on the test's event loop, which owns
the database engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from dueflow import bootstrap
from dueflow.api.app import create_app
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.payments.alipay import signing as alipay_signing
from dueflow.service import accounts, orders
from dueflow.service.deps import Deps
from dueflow.store import payments as payments_store
from dueflow.store import schema
from tests.conftest import table_snapshot
from tests.unit.fuzz import NOW, PROVIDER_KEY, fuzz_settings, simulator_config
from tests.unit.fuzz.test_fuzz_alipay import VALID, broken_bodies, signed_params
from tests.unit.fuzz.test_fuzz_wechatpay import envelopes, headers_for


@dataclass
class Notify:
    """The app's client, its deps, and the loop both run on."""

    deps: Deps
    client: httpx.AsyncClient
    loop: asyncio.AbstractEventLoop

    def run(self, work: Coroutine[Any, Any, Any]) -> Any:
        """Run ``work`` on the app's loop from hypothesis's thread."""
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()


@pytest.fixture
async def notify(db_path: Path) -> AsyncIterator[Notify]:
    config = simulator_config()
    settings = load_settings(
        database_url=f"sqlite:///{db_path}",
        public_url="http://dueflow",
        **dataclasses.asdict(config.client_config("http://sim.invalid")),
    )
    async with bootstrap.running(settings, clock=FakeClock(NOW), migrate_sqlite=False) as deps:
        seller, _ = await accounts.add_user(deps, "seller")
        buyer, _ = await accounts.add_user(deps, "buyer")
        goods_id = await accounts.add_goods(deps, seller_id=seller.id, title="tent", price="88.00")
        await orders.place_order(deps, buyer_id=buyer.id, goods_id=goods_id)
        transport = httpx.ASGITransport(app=create_app(deps))
        async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
            yield Notify(deps, client, asyncio.get_running_loop())


async def post_refused(notify: Notify, path: str, body: bytes, headers: dict[str, str]) -> None:
    """Post one notification; require a refusal that changed nothing but its inbox row."""
    before = await table_snapshot(notify.deps, skip=("notifications",))
    inbox = await table_snapshot(notify.deps)
    # As bytes: a fuzzed header value may hold any character, as it may on the wire.
    raw = [(name.encode(), value.encode()) for name, value in headers.items()]
    answer = await notify.client.post(path, content=body, headers=raw)
    assert answer.status_code == 400, (answer.status_code, answer.text)
    if path == "/notify/alipay":
        assert answer.text == "fail"
    else:
        assert answer.json()["code"] == "FAIL"
    assert await table_snapshot(notify.deps, skip=("notifications",)) == before
    async with notify.deps.db.read() as conn:
        rows = (await conn.execute(select(schema.notifications))).all()
    assert len(rows) == len(inbox["notifications"]) + 1
    assert rows[-1].outcome == "rejected"


header_values = st.dictionaries(
    st.sampled_from(["content-type", "Wechatpay-Serial", "x-forwarded-for", "Content-Encoding"]),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
    max_size=3,
)


async def test_fuzzed_alipay_notifications_are_refused_and_write_nothing(notify):
    @fuzz_settings(40)
    @given(
        body=st.one_of(
            st.binary(max_size=200), signed_params().map(urlencode).map(str.encode), broken_bodies()
        ),
        headers=header_values,
    )
    def posts(body: bytes, headers: dict[str, str]) -> None:
        notify.run(post_refused(notify, "/notify/alipay", body, headers))

    await asyncio.to_thread(posts)


async def test_fuzzed_wechat_notifications_are_refused_and_write_nothing(notify):
    @fuzz_settings(40)
    @given(data=st.data())
    def posts(data: st.DataObject) -> None:
        body = data.draw(st.one_of(envelopes(), st.binary(max_size=100)), label="body")
        headers = data.draw(st.one_of(headers_for(body), header_values), label="headers")
        path = data.draw(st.sampled_from(["/notify/wechatpay", "/notify/wechatpay/refund"]))
        notify.run(post_refused(notify, path, body, headers))

    await asyncio.to_thread(posts)


async def test_a_valid_notification_is_still_accepted(notify):
    """The control: the routes above refused for the fuzzed reason, not every notification. An
    attempt of the open order is recorded (as starting a payment would) and paid by Alipay."""
    pay_no = "20260301bbbbbbbbbbbbbbbb"
    async with notify.deps.db.write() as conn:
        order_id = (await conn.execute(select(schema.orders.c.id))).scalar_one()
        await payments_store.insert_attempt(
            conn,
            pay_no=pay_no,
            order_id=order_id,
            provider="alipay",
            amount=Decimal("88.00"),
            expires_at=NOW + timedelta(minutes=30),
            now=NOW,
        )
    params = {**VALID, "out_trade_no": pay_no}
    params["sign"] = alipay_signing.sign(params, PROVIDER_KEY.private_key)
    answer = await notify.client.post("/notify/alipay", content=urlencode(params).encode())
    assert (answer.status_code, answer.text) == (200, "success")
    assert (await orders.order_view(notify.deps, order_id))["status"] == "pending_shipment"
