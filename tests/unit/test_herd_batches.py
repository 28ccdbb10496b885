"""The herd's batches are set-based: the statements a batch of cancels or notices costs do not
grow with the batch, on SQLite, PostgreSQL and MariaDB; and what the batch gives back adds up
when many orders give back units of the same SKUs and the same buyers' counts (amounts alike
and all different), and when one batch of notices ends every way a send can end."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, select

from dueflow.domain.timers import TimerKind
from dueflow.exceptions import BackendUnavailable, DeliveryUnknown
from dueflow.notifiers.base import Reminder
from dueflow.service import accounts, reminders, shop, timeouts
from dueflow.service import orders as order_service
from dueflow.store import shop as shop_store
from dueflow.store import timers
from dueflow.store.schema import flash_buyers, flash_sales, seat_holds, show_buyers
from dueflow.store.schema import reminders as t_reminders
from dueflow.store.schema import skus as t_skus
from dueflow.store.schema import timers as t_timers
from tests.conftest import RecordingNotifier, World

CLOSED = TimerKind.ORDER_CLOSED
NAMES = itertools.count()


@pytest.fixture
def world(backend_world: World) -> World:
    """Every test on SQLite, PostgreSQL and MariaDB: the statements differ by dialect."""
    return backend_world


@contextmanager
def counting(world: World) -> Iterator[list[str]]:
    """The statements the database is sent meanwhile (transaction control aside)."""
    sent: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            sent.append(statement)

    engine = world.deps.db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", count)


async def due(world: World, kind: TimerKind) -> list[timers.Claimed]:
    """Claim every due timer of ``kind``, an hour on."""
    world.clock.advance(timedelta(hours=1))
    async with world.deps.db.write() as conn:
        claimed = await timers.claim_due(
            conn, now=world.clock.now(), limit=1000, lease=world.deps.lease
        )
    return [t for t in claimed if t.kind is kind]


async def buyers(world: World, n: int) -> list[int]:
    made = []
    for _ in range(n):
        user, _token = await accounts.add_user(world.deps, f"buyer-{next(NAMES)}")
        made.append(user.id)
    return made


async def goods_orders(world: World, n: int) -> None:
    for _ in range(n):
        goods_id = await world.goods()
        await order_service.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)


async def ticket_orders(world: World, n: int) -> None:
    show_id = await world.show(seats=f"A:1-{2 * n}", limit=4)
    people = await buyers(world, (n + 1) // 2)
    for i in range(n):  # each buyer two orders: one seat, then two
        labels = [f"A-{2 * i + 1}", f"A-{2 * i + 2}"][: 1 + i % 2]
        await world.seats(show_id, labels, buyer=people[i // 2])


async def shop_orders(world: World, n: int) -> None:
    for _ in range(n):  # two SKUs of its own each (the batch holds 2n SKUs), and a coupon
        lines = {await world.sku(stock=5): 1, await world.sku(stock=5): 2}
        await world.shop_order(lines, coupon=await world.coupon(off="1.00"))


async def flash_orders(world: World, n: int) -> None:
    sale_id = await world.flash_sale(await world.sku(stock=10 * n), stock=5 * n, limit=3)
    people = await buyers(world, (n + 1) // 2)
    for i in range(n):  # each buyer two orders: one unit, then two
        await shop.place_flash_order(
            world.deps, buyer_id=people[i // 2], flash_sale_id=sale_id, quantity=1 + i % 2
        )


Placing = Callable[[World, int], Awaitable[None]]


async def cancel_statements(world: World, placing: Placing, n: int) -> int:
    await placing(world, n)
    batch = await due(world, TimerKind.CANCEL_UNPAID)
    assert len(batch) == n
    with counting(world) as sent:
        await timeouts.cancel_unpaid(world.deps, batch)
    return len(sent)


@pytest.mark.parametrize(
    "placing",
    [goods_orders, ticket_orders, shop_orders, flash_orders],
    ids=["goods", "seats", "skus_and_coupons", "flash_units"],
)
async def test_a_batch_of_cancels_costs_the_same_statements_for_4_orders_or_16(world, placing):
    few = await cancel_statements(world, placing, 4)
    many = await cancel_statements(world, placing, 16)
    assert many == few


async def test_cancels_give_back_every_unit_and_count_with_shared_skus_and_buyers(world):
    sku_ids = [await world.sku(stock=40) for _ in range(3)]
    for i in range(12):  # the SKUs shared, with amounts of 1 to 3
        lines = {sku_ids[i % 3]: 1 + i % 3, sku_ids[(i + 1) % 3]: 2}
        await world.shop_order(lines, coupon=await world.coupon(off="1.00"))
    await flash_orders(world, 12)
    await ticket_orders(world, 12)
    await timeouts.cancel_unpaid(world.deps, await due(world, TimerKind.CANCEL_UNPAID))
    async with world.deps.db.read() as conn:
        for sku in (await conn.execute(select(t_skus))).all():
            assert (sku.stock, sku.held, sku.sold) == (sku.stocked, 0, 0)
        for sale in (await conn.execute(select(flash_sales))).all():
            assert (sale.stock, sale.held, sale.sold) == (sale.stocked, 0, 0)
        assert set((await conn.execute(select(flash_buyers.c.units))).scalars()) == {0}
        assert set((await conn.execute(select(show_buyers.c.seats))).scalars()) == {0}
        assert (await conn.execute(select(seat_holds))).all() == []
    coupons = await shop.coupons_of(world.deps, world.buyer)
    assert {c["state"] for c in coupons} == {"available"}


@pytest.mark.parametrize("amounts", [[1, 2, 1, 2, 2], [1, 2, 3, 4, 5, 6, 7, 11]])
async def test_many_amounts_at_once_add_up_exactly(world, amounts):
    """Alike amounts go one UPDATE per amount; many different ones through a CASE: both the
    sums of what each SKU got back."""
    skus = [await world.sku(stock=100) for _ in amounts]
    units = dict(zip(skus, amounts, strict=True))
    async with world.deps.db.write() as conn:
        for sku_id, n in units.items():
            assert await shop_store.take(conn, t_skus, sku_id, n, world.clock.now())
    async with world.deps.db.write() as conn:
        assert await shop_store.give_back(conn, t_skus, units, world.clock.now()) == sum(amounts)
    for sku_id in skus:
        view = await shop.sku_view(world.deps, sku_id)
        assert (view["stock"], view["held"]) == (100, 0)


class Mixed(RecordingNotifier):
    """Fails for some orders, answers nothing for others, delivers the rest."""

    def __init__(self, failing: set[int], silent: set[int]) -> None:
        super().__init__()
        self.failing, self.silent = failing, silent

    async def send(self, reminder: Reminder) -> None:
        if reminder.order_id in self.failing:
            raise BackendUnavailable("receiver down")
        if reminder.order_id in self.silent:
            raise DeliveryUnknown("no answer")
        await super().send(reminder)


async def closed_orders(world: World, n: int) -> list[int]:
    sku_id = await world.sku(stock=n)
    ids = []
    for _ in range(n):
        view = await world.shop_order({sku_id: 1})
        await order_service.cancel_by_buyer(world.deps, order_id=view["id"], user_id=world.buyer)
        ids.append(view["id"])
    return ids


async def notice_statements(world: World, n: int) -> int:
    await closed_orders(world, n)
    batch = await due(world, CLOSED)
    assert len(batch) == n
    with counting(world) as sent:
        await reminders.order_closed(world.deps, batch)
    return len(sent)


async def test_a_batch_of_notices_within_the_concurrency_costs_the_same_statements(world):
    world.deps.provider_concurrency = 16
    few = await notice_statements(world, 2)
    many = await notice_statements(world, 16)
    assert many == few
    assert len(world.notifier.sent) == 18


async def test_one_batch_of_notices_records_every_outcome_of_its_sends(world):
    order_ids = await closed_orders(world, 9)
    failing, silent = set(order_ids[:3]), set(order_ids[3:5])
    world.deps.notifier = notifier = Mixed(failing, silent)
    world.deps.provider_concurrency = 4  # the sends come in several groups
    await reminders.order_closed(world.deps, await due(world, CLOSED))
    assert sorted(r.order_id for r in notifier.sent) == order_ids[5:]
    async with world.deps.db.read() as conn:
        rows = {
            r.order_id: r
            for r in (
                await conn.execute(select(t_reminders).where(t_reminders.c.kind == CLOSED.value))
            ).all()
        }
        timer_rows = {
            r.order_id: r
            for r in (
                await conn.execute(select(t_timers).where(t_timers.c.kind == CLOSED.value))
            ).all()
        }
    for oid in order_ids:
        reminder, timer = rows[oid], timer_rows[oid]
        if oid in failing:  # provably not delivered: not counted, retried
            assert (reminder.state, reminder.deliveries) == ("pending", 0)
            assert timer.state == "scheduled" and "receiver down" in timer.last_error
        elif oid in silent:  # maybe delivered: counted, retried under the same id
            assert (reminder.state, reminder.deliveries) == ("pending", 1)
            assert timer.state == "scheduled" and "no answer" in timer.last_error
        else:
            assert (reminder.state, reminder.deliveries) == ("sent", 1)
            assert (timer.state, timer.outcome) == ("done", "sent")
