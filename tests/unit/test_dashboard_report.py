"""The dashboard's reads on SQLite, PostgreSQL and MariaDB: orders by status from the counts kept
up to a watermark equal a count of every order, through moves and watermark moves; the bounded
invariants check the latest changes (and every live order for the deadlines), the full check
every order; ``dueflow status`` and ``status --full`` say which they ran."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import event, func, select, update
from typer.testing import CliRunner

from dueflow import cli
from dueflow.api.admin_pages import dashboard
from dueflow.cli import _common
from dueflow.service import invariants, operations, orders, payments, reads, report
from dueflow.store import counts, schema
from dueflow.store.schema import coupons, flash_buyers, skus
from tests.unit.test_shop_invariants import broken, live_shop, write


async def every_order(world) -> dict[str, int]:
    """Orders by status, each counted: the truth the kept counts must equal."""
    query = select(schema.orders.c.status, func.count()).group_by(schema.orders.c.status)
    async with world.deps.db.read() as conn:
        return {str(s): int(n) for s, n in (await conn.execute(query)).all()}


async def kept(world) -> dict[str, int]:
    async with world.deps.db.read() as conn:
        rows = (await conn.execute(select(schema.order_counts))).all()
    return {row.status: int(row.orders) for row in rows}


async def place(world, n: int) -> list[int]:
    return [
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
        for _ in range(n)
    ]


async def test_orders_by_status_equal_every_order_counted_as_the_watermark_moves(backend_world):
    world = backend_world
    first = await place(world, 4)
    await orders.cancel_by_buyer(world.deps, order_id=first[0], user_id=world.buyer)
    await payments.record_manual_payment(world.deps, order_id=first[1], amount="12.50")
    snap = await report.snapshot(world.deps)
    assert (
        snap.orders
        == await every_order(world)
        == {
            "pending_payment": 2,
            "pending_shipment": 1,
            "cancelled_unpaid": 1,
        }
    )
    # the first look set the watermark MARGIN behind the clock: nothing final was before it
    assert await kept(world) == {status: 0 for status in counts.FINAL}

    world.clock.advance(counts.MARGIN + counts.EVERY)
    snap = await report.snapshot(world.deps)  # catches up: the cancel is now kept
    assert (await kept(world))["cancelled_unpaid"] == 1
    assert snap.orders == await every_order(world)

    # the unpaid ones expire (cancelled_unpaid), the paid one is cancelled by its seller
    await orders.cancel_by_seller(world.deps, order_id=first[1], user_id=world.seller)
    world.clock.advance(timedelta(minutes=30))
    await world.worker.drain()
    second = await place(world, 2)
    assert (await report.snapshot(world.deps)).orders == await every_order(world)
    world.clock.advance(counts.MARGIN + counts.EVERY)
    snap = await report.snapshot(world.deps)
    assert (
        snap.orders
        == await every_order(world)
        == {
            "pending_payment": 2,
            "cancelled_unpaid": 3,
            "cancelled_unshipped": 1,
        }
    )
    assert await kept(world) == {
        "cancelled_unpaid": 3,
        "cancelled_unshipped": 1,
        "cancelled_paid": 0,
        "completed": 0,
    }
    # a look before the next window is due moves nothing, and still counts what moved since
    await orders.cancel_by_buyer(world.deps, order_id=second[0], user_id=world.buyer)
    assert (await report.snapshot(world.deps)).orders == await every_order(world)
    assert (await kept(world))["cancelled_unpaid"] == 3
    full = await report.snapshot(world.deps, full=True)
    assert (full.orders, full.full) == (await every_order(world), True)
    assert full.timers["done"] > 0 and "done" not in (await report.snapshot(world.deps)).timers


async def test_the_bounded_check_reads_the_latest_changes_the_full_check_every_order(
    backend_world,
):
    world = backend_world
    [broken] = await place(world, 1)
    await orders.cancel_by_buyer(world.deps, order_id=broken, user_id=world.buyer)
    goods_id = (await orders.order_view(world.deps, broken))["goods_id"]
    # a bug left the cancelled order's goods held
    async with world.deps.db.write() as conn:
        await conn.execute(
            update(schema.goods)
            .where(schema.goods.c.id == goods_id)
            .values(reserved_order_id=broken)
        )
    checked = await invariants.check_recent(world.deps, limit=2)
    assert (checked.full, checked.orders, checked.invariants.held_by_dead_order) == (
        False,
        1,
        [goods_id],
    )
    assert checked.since == world.clock.now()

    world.clock.advance(timedelta(seconds=1))
    await place(world, 2)  # two later changes: the broken order is out of the last two
    checked = await invariants.check_recent(world.deps, limit=2)
    assert (checked.orders, checked.limit, checked.invariants.ok) == (2, 2, True)
    assert checked.since == world.clock.now()
    full = await invariants.check_full(world.deps)
    assert (full.full, full.orders, full.invariants.held_by_dead_order) == (True, 3, [goods_id])
    assert (await invariants.check_recent(world.deps, limit=3)).invariants.held_by_dead_order
    assert (await invariants.check_invariants(world.deps)) == full.invariants

    # an order left past its deadline did not move: the bounded check still finds it
    async with world.deps.db.write() as conn:
        await conn.execute(update(schema.timers).values(state="cancelled"))
    world.clock.advance(timedelta(hours=1))
    await place(world, 2)
    late = await invariants.check_recent(world.deps, limit=2)
    assert len(late.invariants.past_deadline) == 2  # the two placed before the hour


def test_status_says_which_check_it_ran(backend_world, backend_url, monkeypatch):
    monkeypatch.setenv("DUEFLOW_DATABASE_URL", backend_url)
    # The console took its width when first imported (80 without a terminal): a line each.
    monkeypatch.setattr(_common.out, "width", 200)
    bounded = CliRunner(env={"COLUMNS": "200"}).invoke(cli.app, ["status"])
    assert bounded.exit_code == 0, bounded.output
    assert "invariants checked over the last 0 changes" in bounded.output
    assert "needs attention: parked timer" in bounded.output
    assert "timers parked" in bounded.output and "timers done" not in bounded.output
    full = CliRunner(env={"COLUMNS": "200"}).invoke(cli.app, ["status", "--full"])
    assert full.exit_code == 0, full.output
    assert "invariants checked over every order (0)" in full.output
    assert "timers done" in full.output


async def test_a_bounded_check_over_a_shop_names_what_the_full_check_names(world):
    shop_life = await live_shop(world)
    buyer = flash_buyers.c
    await write(
        world,
        update(skus).where(skus.c.id == shop_life.sku).values(stocked=skus.c.stocked + 1),
        update(skus)
        .where(skus.c.id == shop_life.other_sku)
        .values(stock=skus.c.stock + 1, sold=skus.c.sold - 1),
        update(flash_buyers)
        .where((buyer.flash_sale_id == shop_life.sale) & (buyer.buyer_id == world.buyer))
        .values(units=0),
        update(coupons).where(coupons.c.id == shop_life.coupon).values(state="used"),
        unchecked=True,
    )
    full = broken(await invariants.check_invariants(world.deps, tolerance_seconds=0))
    assert full == {
        "units_unbalanced": [shop_life.sku],
        "units_sold_unpaid": [shop_life.other_sku],
        "flash_limits_broken": [shop_life.sale],
        "coupons_used_by_unpaid_order": [shop_life.coupon],
    }
    bounded = await invariants.check_recent(world.deps, tolerance_seconds=0)
    assert broken(bounded.invariants) == full  # every order of the shop moved lately


async def test_overdue_timers_are_counted_and_listed_read_side_by_side(backend_world):
    # On PostgreSQL and MariaDB the snapshot's reads and the dashboard's run side by side,
    # each on a connection of its own (service/reads.py); the counts are those read one by one.
    world = backend_world
    placed = await place(world, 3)
    world.clock.advance(timedelta(hours=1))  # past every pay deadline and the scan's grace
    snap, checked = await report.snapshot_and_check(world.deps)
    # each order's pay deadline and payment reminder
    assert (snap.overdue, snap.orders["pending_payment"], checked.orders) == (6, 3, 3)
    assert checked.invariants.past_deadline == sorted(placed)
    page = await dashboard._read(world.deps)
    overdue = page["overdue"]
    assert sorted(t["order_id"] for t in overdue) == sorted(placed * 2)
    assert [(t["due_at"], t["id"]) for t in overdue] == sorted(
        (t["due_at"], t["id"]) for t in overdue
    )
    assert {t["order_status"] for t in overdue} == {"pending_payment"}
    assert await operations.overdue_timers(world.deps, 2) == overdue[:2]
    assert page["snap"].overdue == 6 and page["checked"].invariants.past_deadline == placed


async def test_a_dashboard_holds_at_most_its_width_of_connections(backend_world):
    # The page's reads side by side take at most reads.WIDTH of the pool's connections at once,
    # the watermark's catch-up and the bounded check's first read included (one on SQLite).
    world = backend_world
    await place(world, 3)
    world.clock.advance(timedelta(hours=1))  # the watermark is due to move
    engines = {
        id(e.sync_engine): e.sync_engine
        for e in (world.deps.db.engine, world.deps.db.report_engine)
    }
    held = peak = 0

    def checkout(*_: object) -> None:
        nonlocal held, peak
        held += 1
        peak = max(peak, held)

    def checkin(*_: object) -> None:
        nonlocal held
        held -= 1

    for engine in engines.values():
        event.listen(engine.pool, "checkout", checkout)
        event.listen(engine.pool, "checkin", checkin)
    try:
        page = await dashboard._read(world.deps)
    finally:
        for engine in engines.values():
            event.remove(engine.pool, "checkout", checkout)
            event.remove(engine.pool, "checkin", checkin)
    assert page["snap"].orders["pending_payment"] == 3
    assert 1 <= peak <= reads.WIDTH
