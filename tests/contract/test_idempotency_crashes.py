"""A keyed request that dies between its effect and its answer being kept (the process crashed:
here, keeping the answer raises), on SQLite, PostgreSQL and MariaDB. While the claim's lease
runs, a repeat is told the key is in use and changes nothing; after it, the repeat runs the
route again and the route keeps one effect: a payment start resumes the attempt (one trade, one
pay number), a refund already sent is not sent again, a cancelled order is not cancelled twice.
And the key's other rules on a route other than placing: a bad key, a refused request (which
keeps no key), a key's 24 hours, and what a key costs in statements."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import event, func, select

from dueflow.exceptions import ProviderUnavailable
from dueflow.payments.base import RefundResult
from dueflow.service import replays
from dueflow.store import idempotency
from dueflow.store.schema import idempotency_keys, order_events, payments
from tests.conftest import table_snapshot
from tests.unit.api import Api
from tests.unit.api.shop_world import fails, shop_api

KEY = {"Idempotency-Key": "crash-1"}


class Crash(Exception):
    """The process died here (nothing after it ran)."""


@pytest.fixture
async def api(backend_world) -> AsyncIterator[Api]:
    async with shop_api(backend_world.deps) as api:
        yield api


@pytest.fixture
def crash_before_the_answer_is_kept(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Keeping the answer dies; undo() makes it work again (the server restarted)."""
    real = replays.keep

    async def dies(*args: Any, **kwargs: Any) -> None:
        raise Crash

    monkeypatch.setattr(replays, "keep", dies)

    class Undo:
        @staticmethod
        def undo() -> None:
            monkeypatch.setattr(replays, "keep", real)

    return Undo


async def _crashed(api: Api, url: str, who: str, body: dict[str, Any] | None = None) -> None:
    """Send the keyed request whose answer is never kept."""
    with pytest.raises(Crash):
        await api.call("POST", url, who, headers=KEY, **({} if body is None else {"json": body}))


async def _in_use_then_rerun(api: Api, url: str, who: str, body: Any = None) -> Any:
    """A repeat while the dead request's lease runs: 409 in use, nothing changed; then, the
    lease over, the repeat runs the route again: its answer."""
    kwargs: dict[str, Any] = {"headers": KEY, **({} if body is None else {"json": body})}
    before = await table_snapshot(api.deps)
    fails(await api.call("POST", url, who, **kwargs), 409, "idempotency_key_in_use")
    api.deps.clock.advance(idempotency.LEASE - idempotency.LEASE / 60)
    fails(await api.call("POST", url, who, **kwargs), 409, "idempotency_key_in_use")
    assert await table_snapshot(api.deps) == before
    api.deps.clock.advance(idempotency.LEASE / 60)
    return await api.call("POST", url, who, **kwargs)


async def _count(api: Api, query: Any) -> int:
    async with api.deps.db.read() as conn:
        return int(await conn.scalar(query))


def _events(order_id: int, name: str) -> Any:
    e = order_events.c
    return select(func.count()).where(e.order_id == order_id, e.event == name)


def _attempts(order_id: int) -> Any:
    return select(func.count()).where(payments.c.order_id == order_id)


def _started(api: Api) -> list[str]:
    """The pay numbers the provider was asked to start, in order."""
    started: list[str] = []
    real = api.provider.start

    async def start(attempt: Any, *, subject: str) -> Any:
        started.append(attempt.pay_no)
        return await real(attempt, subject=subject)

    api.provider.start = start  # type: ignore[method-assign]
    return started


async def test_a_payment_start_rerun_after_a_crash_resumes_its_attempt(
    api, crash_before_the_answer_is_kept
):
    order_id = await api.order()
    started = _started(api)
    url, body = f"/api/orders/{order_id}/payments", {"provider": "fakepay"}
    await _crashed(api, url, "buyer", body)
    assert len(started) == 1
    crash_before_the_answer_is_kept.undo()
    answer = await _in_use_then_rerun(api, url, "buyer", body)
    assert answer.status_code == 201, answer.text
    # The provider was asked for the same trade each time: one attempt, one pay number.
    assert answer.json()["pay_no"] == started[0]
    assert set(started) == {started[0]}
    assert await _count(api, _attempts(order_id)) == 1
    assert await _count(api, _events(order_id, "payment_started")) == 1
    again = await api.call("POST", url, "buyer", headers=KEY, json=body)
    assert (again.status_code, again.content) == (201, answer.content)


async def test_a_payment_start_the_provider_failed_is_resumed_by_its_repeat(api):
    order_id = await api.order()
    started = _started(api)
    real = api.provider.start

    async def unanswered(attempt: Any, *, subject: str) -> Any:
        started.append(attempt.pay_no)
        raise ProviderUnavailable("fakepay timed out")

    api.provider.start = unanswered  # type: ignore[method-assign]
    url, body = f"/api/orders/{order_id}/payments", {"provider": "fakepay"}
    failed = await api.call("POST", url, "buyer", headers=KEY, json=body)
    assert failed.status_code == 503, failed.text
    api.provider.start = real  # type: ignore[method-assign]
    # At once (a failure lets its key go): the same attempt is started again.
    answer = await api.call("POST", url, "buyer", headers=KEY, json=body)
    assert answer.status_code == 201, answer.text
    assert answer.json()["pay_no"] == started[0]
    assert await _count(api, _attempts(order_id)) == 1
    # Another provider with the key: another request.
    fails(
        await api.call("POST", url, "buyer", headers=KEY, json={"provider": "manual"}),
        409,
        "idempotency_key_reused",
    )


@pytest.mark.parametrize("action", ["approve", "retry"])
async def test_a_refund_action_rerun_after_a_crash_does_not_send_it_again(
    api, action, monkeypatch, crash_before_the_answer_is_kept
):
    refund_id = await api.refund()
    if action == "retry":
        api.provider.refund_answers.append(RefundResult.FAILED)
        approved = await api.call("POST", f"/api/admin/refunds/{refund_id}/approve", "admin")
        assert approved.json()["state"] == "failed", approved.text
    sent: list[str] = []
    real = api.provider.refund

    async def refund(request: Any) -> Any:
        sent.append(request.refund_no)
        return await real(request)

    monkeypatch.setattr(api.provider, "refund", refund)
    url = f"/api/admin/refunds/{refund_id}/{action}"
    await _crashed(api, url, "admin")
    assert len(sent) == 1
    [order_id] = [r.order_id for r in await _refunds(api, refund_id)]
    submitted = await _count(api, _events(order_id, "refund_submitted"))
    crash_before_the_answer_is_kept.undo()
    rerun = await _in_use_then_rerun(api, url, "admin")
    # The refund is final (succeeded): its state guard refuses, and nothing is sent again.
    fails(rerun, 409, "invalid_transition", "succeeded")
    assert len(sent) == 1
    assert await _count(api, _events(order_id, "refund_submitted")) == submitted
    assert [r.state for r in await _refunds(api, refund_id)] == ["succeeded"]


async def _refunds(api: Api, refund_id: int) -> list[Any]:
    from dueflow.store.schema import refunds

    async with api.deps.db.read() as conn:
        return list((await conn.execute(select(refunds).where(refunds.c.id == refund_id))).all())


async def test_a_cancel_rerun_after_a_crash_cancels_once(api, crash_before_the_answer_is_kept):
    order_id = await api.order()
    url = f"/api/orders/{order_id}/cancel"
    await _crashed(api, url, "buyer")
    crash_before_the_answer_is_kept.undo()
    rerun = await _in_use_then_rerun(api, url, "buyer")
    fails(rerun, 409, "invalid_transition")
    assert await _count(api, _events(order_id, "buyer_cancel")) == 1


@pytest.mark.parametrize("key", ["two words", "x" * 256, "", "caf\u00e9"])
async def test_a_bad_key_is_refused_on_every_route(api, key):
    order_id = await api.order()
    before = await table_snapshot(api.deps)
    answer = await api.call(
        "POST",
        f"/api/orders/{order_id}/cancel",
        "buyer",
        headers={"Idempotency-Key": key.encode()},
    )
    fails(answer, 422, "invalid_input", "Idempotency-Key")
    assert await table_snapshot(api.deps) == before


async def test_a_refused_request_keeps_no_key(api):
    order_id = await api.order()  # not paid: it cannot be shipped
    url, body = f"/api/orders/{order_id}/ship", {"carrier": "SF", "tracking_no": "1"}
    before = await table_snapshot(api.deps)
    fails(await api.call("POST", url, "seller", headers=KEY, json=body), 409, "invalid_transition")
    assert await table_snapshot(api.deps) == before
    # The key is free: another request takes it.
    goods = await api.call(
        "POST", "/api/goods", "seller", headers=KEY, json={"title": "tent", "price": "1.00"}
    )
    assert goods.status_code == 201, goods.text


async def test_a_key_lives_a_day(api):
    def goods(price: str) -> Any:
        body = {"title": "tent", "price": price}
        return api.call("POST", "/api/goods", "seller", headers=KEY, json=body)

    first = await goods("1.00")
    api.deps.clock.advance(idempotency.KEEP - idempotency.LEASE)
    assert (await goods("1.00")).content == first.content
    fails(await goods("2.00"), 409, "idempotency_key_reused")
    api.deps.clock.advance(idempotency.LEASE)
    second = await goods("2.00")
    assert second.status_code == 201, second.text
    assert second.json()["id"] != first.json()["id"]
    async with api.deps.db.read() as conn:
        rows = (await conn.execute(select(idempotency_keys))).all()
    assert [(r.principal, r.route, r.status_code) for r in rows] == [
        (f"user:{api.ids['seller']}", "/api/goods", 201)
    ]
    # Another caller's key of the same text is theirs alone.
    body = {"title": "tent", "price": "1.00"}
    mine = await api.call("POST", "/api/goods", "buyer", headers=KEY, json=body)
    assert mine.status_code == 201, mine.text


async def test_a_key_costs_two_statements_and_no_key_none(api):
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    engine = api.deps.db.engine.sync_engine
    orders = [await api.order() for _ in range(2)]
    event.listen(engine, "before_cursor_execute", seen)
    try:
        for order_id, headers in zip(orders, [{}, KEY], strict=True):
            statements.clear()
            answer = await api.call(
                "POST", f"/api/orders/{order_id}/cancel", "buyer", headers=headers
            )
            assert answer.status_code == 200, answer.text
            keyed = [s for s in statements if "idempotency_keys" in s]
            assert len(keyed) == (2 if headers else 0), keyed
        statements.clear()
        again = await api.call("POST", f"/api/orders/{orders[1]}/cancel", "buyer", headers=KEY)
        assert again.status_code == 200
        # A repeat: the claim refused by the unique key, and the read of the first answer.
        assert len([s for s in statements if "idempotency_keys" in s]) == 2
    finally:
        event.remove(engine, "before_cursor_execute", seen)
