"""A parked timer (its handler failed on every attempt) on the admin dashboard, the timers
page and API, /metrics, and run again from the page."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import select

from dueflow.domain.timers import TimerKind
from dueflow.service import orders
from dueflow.service.deps import Deps
from dueflow.service.timeouts import HANDLERS
from dueflow.store.schema import timers as t_timers
from dueflow.store.timers import Claimed
from dueflow.worker.runner import Worker
from tests.unit.api.test_admin_pages import admin, csrf_of, log_in  # noqa: F401


async def parked_cancel(world) -> tuple[int, int]:
    """An order whose unpaid cancel failed on every attempt: (order id, timer id)."""

    async def boom(deps: Deps, batch: Sequence[Claimed]) -> None:
        raise RuntimeError("a bug trips on this order")

    worker = Worker(world.deps, handlers={**HANDLERS, TimerKind.CANCEL_UNPAID: boom})
    order_id = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    query = select(t_timers).where(
        t_timers.c.order_id == order_id, t_timers.c.kind == TimerKind.CANCEL_UNPAID.value
    )
    world.clock.advance(timedelta(minutes=30))
    for _ in range(world.deps.timer_max_attempts):
        await worker.drain()
        async with world.deps.db.read() as conn:
            timer = (await conn.execute(query)).one()
        if timer.state == "parked":
            return order_id, timer.id
        world.clock.advance(timer.due_at - world.clock.now())
    raise AssertionError(f"not parked after {world.deps.timer_max_attempts} attempts")


async def test_a_parked_timer_is_shown_counted_and_run_again_from_the_dashboard(
    admin,  # noqa: F811
    world,
):
    client, token = admin
    order_id, timer_id = await parked_cancel(world)
    headers = {"Authorization": f"Bearer {token}"}
    listed = await client.get("/api/admin/timers?state=parked", headers=headers)
    assert listed.status_code == 200
    [timer] = listed.json()
    assert (timer["id"], timer["state"], timer["attempts"]) == (timer_id, "parked", 20)
    assert timer["last_error"] == "RuntimeError: a bug trips on this order"
    assert "dueflow_timers_parked 1.0" in (await client.get("/metrics")).text
    assert 'dueflow_needs_attention{kind="parked_timer"} 1.0' in (await client.get("/metrics")).text

    await log_in(client, token)
    page = await client.get("/admin")
    parked = page.text.split('id="attention"', 1)[1].split("</section>", 1)[0]
    assert f"/admin/timers/{timer_id}/run-now" in parked
    assert "Run again" in parked
    assert (
        f"/admin/timers/{timer_id}/run-now" in (await client.get("/admin/timers?state=parked")).text
    )

    answer = await client.post(
        f"/admin/timers/{timer_id}/run-now", data={"csrf": csrf_of(page.text), "back": "/admin"}
    )
    assert answer.status_code == 303
    await world.worker.drain()  # the cause fixed: the worker's own handlers
    assert (await orders.order_view(world.deps, order_id))["status"] == "cancelled_unpaid"
    assert "dueflow_timers_parked 0.0" in (await client.get("/metrics")).text
