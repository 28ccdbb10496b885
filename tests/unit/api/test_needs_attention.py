"""What needs a person, in one list: a parked timer, a failed refund, a refund processing over
an hour, a discrepancy whose refund awaits review; each on the dashboard with the action that
resolves it, counted by kind in /metrics (dueflow_needs_attention), with its alert rule; the full
check of the invariants on demand."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import yaml

from dueflow.payments.base import RefundResult
from dueflow.service import attention, orders, payments, refunds
from tests.unit.api.test_admin_pages import admin, csrf_of, log_in  # noqa: F401
from tests.unit.api.test_parked_timers import parked_cancel
from tests.unit.test_refunds import ScriptedProvider, unshipped_refund, use

ROOT = Path(__file__).resolve().parents[3]


async def each_kind(world) -> dict[str, tuple[int, int]]:
    """One of each kind: kind -> (its id, its order's id)."""
    order_id, timer_id = await parked_cancel(world)
    # failed; unknown (processing); failed again when a reject asks it first
    use(world, ScriptedProvider([RefundResult.FAILED, RefundResult.UNKNOWN, RefundResult.FAILED]))
    failed_order, failed = await unshipped_refund(world, "scripted")
    assert await refunds.approve(world.deps, failed) == "failed"
    stuck_order, stuck = await unshipped_refund(world, "scripted")
    assert await refunds.approve(world.deps, stuck) == "processing"
    # an unpaid order cancelled, then paid: a discrepancy and a refund in review
    late_order = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    await orders.cancel_by_buyer(world.deps, order_id=late_order, user_id=world.buyer)
    await payments.record_manual_payment(world.deps, order_id=late_order, amount="12.50")
    [in_review] = await refunds.list_refunds(world.deps, state="pending_review")
    return {
        attention.PARKED_TIMER: (timer_id, order_id),
        attention.REFUND_FAILED: (failed, failed_order),
        attention.REFUND_STUCK: (stuck, stuck_order),
        attention.DISCREPANCY: (in_review["id"], late_order),
    }


async def test_each_kind_is_listed_with_its_action_and_counted(world):
    found = await each_kind(world)
    listed = {item.kind: item for item in await attention.needs_attention(world.deps)}
    # processing for less than an hour is not stuck yet
    assert set(listed) == set(attention.KINDS) - {attention.REFUND_STUCK}
    world.clock.advance(attention.REFUND_STUCK_AFTER + timedelta(seconds=1))
    items = await attention.needs_attention(world.deps)
    assert [item.kind for item in items] == list(attention.KINDS)
    by_kind = {item.kind: item for item in items}
    for kind, (_, order_id) in found.items():
        assert by_kind[kind].order_id == order_id
    timer_id, _ = found[attention.PARKED_TIMER]
    assert [(a.label, a.url, a.post) for a in by_kind[attention.PARKED_TIMER].actions] == [
        ("Run again", f"/admin/timers/{timer_id}/run-now", True)
    ]
    failed, _ = found[attention.REFUND_FAILED]
    assert by_kind[attention.REFUND_FAILED].actions[0].url == f"/admin/refunds/{failed}/retry"
    assert by_kind[attention.REFUND_STUCK].actions[0].url == "/admin/refunds?state=processing"
    refund_id, _ = found[attention.DISCREPANCY]
    assert by_kind[attention.DISCREPANCY].actions[0].url == f"/admin/refunds/{refund_id}/approve"
    assert "paid_after_cancel" in by_kind[attention.DISCREPANCY].what
    async with world.deps.db.report() as conn:
        assert await attention.counts(conn, world.clock.now()) == dict.fromkeys(attention.KINDS, 1)

    # resolved, each leaves the list
    await refunds.reject(world.deps, failed, reason="paid by hand", actor="user:1")
    await refunds.approve(world.deps, refund_id)
    async with world.deps.db.report() as conn:
        left = await attention.counts(conn, world.clock.now())
    assert (left[attention.REFUND_FAILED], left[attention.DISCREPANCY]) == (0, 0)


async def test_the_dashboard_lists_them_and_metrics_count_them(admin, world):  # noqa: F811
    client, token = admin
    found = await each_kind(world)
    world.clock.advance(attention.REFUND_STUCK_AFTER + timedelta(seconds=1))
    metrics = (await client.get("/metrics")).text
    for kind in attention.KINDS:
        assert f'dueflow_needs_attention{{kind="{kind}"}} 1.0' in metrics

    await log_in(client, token)
    page = await client.get("/admin")
    listed = page.text.split('id="attention"', 1)[1].split("</section>", 1)[0]
    for kind, (_, order_id) in found.items():
        assert f'<tr class="{kind}"' in listed
        assert f"/admin/orders/{order_id}" in listed
    refund_id, _ = found[attention.DISCREPANCY]
    assert f'action="/admin/refunds/{refund_id}/approve"' in listed
    assert 'href="/admin/refunds?state=processing"' in listed
    assert "<b>4</b> need attention" in page.text

    # the action posts from the list and the item leaves it
    failed, _ = found[attention.REFUND_FAILED]
    use(world, ScriptedProvider([RefundResult.SUCCEEDED]))
    answer = await client.post(
        f"/admin/refunds/{failed}/retry",
        data={"csrf": csrf_of(page.text), "back": "/admin#attention"},
    )
    assert answer.status_code == 303
    assert (
        'dueflow_needs_attention{kind="refund_failed"} 0.0' in (await client.get("/metrics")).text
    )


async def test_the_dashboard_labels_its_bounded_check_and_offers_the_full_one(admin, world):  # noqa: F811
    client, token = admin
    await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
    await log_in(client, token)
    page = (await client.get("/admin")).text
    checked = page.split('id="checked"', 1)[1].split("</section>", 1)[0]
    assert "the last 1 changes" in checked
    assert 'href="/admin/invariants"' in checked
    full = await client.get("/admin/invariants")
    assert full.status_code == 200
    assert "every invariant holds over every order" in full.text
    assert "Every promise over every order (1)" in full.text


def test_an_alert_rule_watches_what_needs_attention():
    rules = yaml.safe_load((ROOT / "docs" / "alerts.yml").read_text())["groups"][0]["rules"]
    [rule] = [r for r in rules if r["alert"] == "DueflowNeedsAttention"]
    assert "dueflow_needs_attention" in rule["expr"]
    assert "/admin#attention" in rule["annotations"]["description"]
