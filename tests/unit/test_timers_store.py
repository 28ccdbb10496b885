"""The timer statements in dueflow.store.timers, run directly against a migrated SQLite file."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from sqlalchemy import select, update

from dueflow.domain.timers import TimerKind, TimerState
from dueflow.service import operations
from dueflow.store import orders, timers
from dueflow.store.schema import timers as t_timers

LEASE = timedelta(seconds=60)
K = TimerKind


async def make_orders(world, n: int) -> list[int]:
    """Bare order rows (no timers of their own), so each test schedules exactly what it needs."""
    goods_id = await world.goods()
    now = world.clock.now()
    ids = []
    async with world.deps.db.write() as conn:
        for _ in range(n):
            ids.append(
                await orders.insert_order(
                    conn,
                    flow="marketplace",
                    order_type="normal",
                    buyer_id=world.buyer,
                    seller_id=world.seller,
                    goods_id=goods_id,
                    amount=Decimal("12.50"),
                    status="pending_payment",
                    created_at=now,
                    updated_at=now,
                    pay_deadline=now + timedelta(minutes=30),
                )
            )
    return ids


async def schedule(world, *new: tuple[int, TimerKind, timedelta]) -> list[int]:
    """Schedule timers (order, kind, due after now); returns their ids in the order given."""
    now = world.clock.now()
    async with world.deps.db.write() as conn:
        await timers.schedule(conn, [timers.NewTimer(o, k, now + d) for o, k, d in new], now)
        ids = []
        for order_id, kind, _ in new:
            query = select(t_timers.c.id).where(
                t_timers.c.order_id == order_id, t_timers.c.kind == kind.value
            )
            ids.append((await conn.execute(query)).scalar_one())
    return ids


async def rows(world) -> dict[int, object]:
    async with world.deps.db.read() as conn:
        return {r.id: r for r in (await conn.execute(select(t_timers))).all()}


async def row(world, timer_id: int):
    return (await rows(world))[timer_id]


async def set_state(world, timer_id: int, state: TimerState) -> None:
    async with world.deps.db.write() as conn:
        await conn.execute(
            update(t_timers).where(t_timers.c.id == timer_id).values(state=state.value)
        )


async def test_schedule_writes_scheduled_rows_and_returns_them_armed(world):
    (o,) = await make_orders(world, 1)
    now = world.clock.now()
    async with world.deps.db.write() as conn:
        armed = await timers.schedule(
            conn,
            [
                timers.NewTimer(o, K.CANCEL_UNPAID, now + timedelta(minutes=30)),
                timers.NewTimer(o, K.PAY_REMINDER, now + timedelta(minutes=5)),
            ],
            now,
        )
        assert await timers.schedule(conn, [], now) == []
    stored = await rows(world)
    assert sorted((a.id, a.due_at) for a in armed) == sorted(
        (r.id, r.due_at) for r in stored.values()
    )
    for r in stored.values():
        assert r.state == "scheduled"
        assert r.attempts == 0
        assert r.deadline_at == r.due_at
        assert r.stuck is False
        assert r.claim_token is None and r.lease_until is None
        assert r.created_at == now


async def test_claim_due_takes_only_due_scheduled_timers_earliest_first(world):
    o1, o2, o3, o4, o5 = await make_orders(world, 5)
    # Ids are given out in this order; due times deliberately not in id order.
    late, early, tie_a, tie_b, future = await schedule(
        world,
        (o1, K.CANCEL_UNPAID, timedelta(minutes=3)),
        (o2, K.CANCEL_UNPAID, timedelta(minutes=1)),
        (o3, K.CANCEL_UNPAID, timedelta(minutes=2)),
        (o4, K.CANCEL_UNPAID, timedelta(minutes=2)),
        (o5, K.CANCEL_UNPAID, timedelta(minutes=10)),
    )
    assert tie_a < tie_b
    done = (await schedule(world, (o1, K.PAY_REMINDER, timedelta(0))))[0]
    await set_state(world, done, TimerState.DONE)
    world.clock.advance(timedelta(minutes=5))
    now = world.clock.now()

    async with world.deps.db.write() as conn:
        first = await timers.claim_due(conn, now=now, limit=3, lease=LEASE)
    assert [c.id for c in first] == [early, tie_a, tie_b]
    assert len({c.token for c in first}) == 1
    assert all(c.attempts == 1 and c.kind is K.CANCEL_UNPAID for c in first)
    stored = await rows(world)
    for c in first:
        r = stored[c.id]
        assert r.state == "claimed"
        assert r.attempts == 1
        assert r.lease_until == now + LEASE
        assert r.claim_token == c.token
        assert c.order_id == r.order_id and c.due_at == r.due_at
        assert c.deadline_at == r.deadline_at
    assert stored[late].state == "scheduled"
    assert stored[future].state == "scheduled"
    assert stored[done].state == "done"

    async with world.deps.db.write() as conn:
        second = await timers.claim_due(conn, now=now, limit=10, lease=LEASE)
        third = await timers.claim_due(conn, now=now, limit=10, lease=LEASE)
    assert [c.id for c in second] == [late]
    assert second[0].token != first[0].token
    assert third == []
    after = await rows(world)
    for c in first:  # the second claim did not touch the first one's timers
        assert after[c.id].claim_token == c.token
        assert after[c.id].attempts == 1
    assert after[future].state == "scheduled" and after[future].attempts == 0


async def test_claim_due_includes_a_timer_due_exactly_now_but_not_one_microsecond_later(world):
    o1, o2 = await make_orders(world, 2)
    now_due, later = await schedule(
        world,
        (o1, K.CANCEL_UNPAID, timedelta(minutes=1)),
        (o2, K.CANCEL_UNPAID, timedelta(minutes=1, microseconds=1)),
    )
    world.clock.advance(timedelta(minutes=1))
    async with world.deps.db.write() as conn:
        claimed = await timers.claim_due(conn, now=world.clock.now(), limit=10, lease=LEASE)
    assert [c.id for c in claimed] == [now_due]
    assert (await row(world, later)).state == "scheduled"


async def test_claim_ids_leaves_done_cancelled_claimed_and_future_timers_alone(world):
    o1, o2, o3, o4, o5 = await make_orders(world, 5)
    done, cancelled, claimed, future, due = await schedule(
        world,
        (o1, K.CANCEL_UNPAID, timedelta(0)),
        (o2, K.CANCEL_UNPAID, timedelta(0)),
        (o3, K.CANCEL_UNPAID, timedelta(0)),
        (o4, K.CANCEL_UNPAID, timedelta(hours=1)),
        (o5, K.CANCEL_UNPAID, timedelta(0)),
    )
    now = world.clock.now()
    await set_state(world, done, TimerState.DONE)
    await set_state(world, cancelled, TimerState.CANCELLED)
    async with world.deps.db.write() as conn:
        held = await timers.claim_ids(conn, [claimed], now=now, lease=LEASE)
    assert [c.id for c in held] == [claimed]
    before = await rows(world)

    async with world.deps.db.write() as conn:
        got = await timers.claim_ids(
            conn, [done, cancelled, claimed, future, 999_999], now=now, lease=LEASE
        )
    assert got == []
    assert await rows(world) == before

    # A repeated id is claimed once; the stray ones beside it still change nothing.
    async with world.deps.db.write() as conn:
        got = await timers.claim_ids(conn, [due, due, done, future], now=now, lease=LEASE)
    assert [c.id for c in got] == [due]
    after = await rows(world)
    assert after[due].state == "claimed" and after[due].attempts == 1
    assert {k: v for k, v in after.items() if k != due} == {
        k: v for k, v in before.items() if k != due
    }


async def test_finish_needs_the_claim_token_and_the_claimed_state(world):
    o1, o2 = await make_orders(world, 2)
    t1, t2 = await schedule(
        world, (o1, K.CANCEL_UNPAID, timedelta(0)), (o2, K.CANCEL_UNPAID, timedelta(0))
    )
    now = world.clock.now()
    async with world.deps.db.write() as conn:
        claimed = await timers.claim_due(conn, now=now, limit=10, lease=LEASE)
    token = claimed[0].token

    world.clock.advance(5)
    later = world.clock.now()
    async with world.deps.db.write() as conn:
        assert await timers.finish(conn, {t1: "x", t2: "x"}, token="not-ours", now=later) == 0
    assert {r.state for r in (await rows(world)).values()} == {"claimed"}

    async with world.deps.db.write() as conn:
        assert (
            await timers.finish(conn, {t1: "cancelled", t2: "o" * 300}, token=token, now=later) == 2
        )
    r1, r2 = await row(world, t1), await row(world, t2)
    assert (r1.state, r1.outcome, r1.done_at, r1.lease_until) == ("done", "cancelled", later, None)
    assert r2.state == "done" and r2.outcome == "o" * 200

    # Done already: finishing again (same token) changes nothing.
    async with world.deps.db.write() as conn:
        assert await timers.finish(conn, {t1: "again"}, token=token, now=later) == 0
    assert (await row(world, t1)).outcome == "cancelled"

    # A token that was ours once is no fence after a retry handed the timer back.
    (o3,) = await make_orders(world, 1)
    (t3,) = await schedule(world, (o3, K.CANCEL_UNPAID, timedelta(0)))
    async with world.deps.db.write() as conn:
        (c3,) = await timers.claim_ids(conn, [t3], now=later, lease=LEASE)
        await timers.retry(conn, [c3], error="boom", now=later)
        assert await timers.finish(conn, {t3: "late"}, token=c3.token, now=later) == 0
    assert (await row(world, t3)).state == "scheduled"


async def test_retry_backs_off_doubling_to_a_cap_and_flags_stuck_after_five(world):
    (o,) = await make_orders(world, 1)
    (t,) = await schedule(world, (o, K.CANCEL_UNPAID, timedelta(0)))
    expected = [30, 60, 120, 240, 480, 600, 600]
    for attempt, seconds in enumerate(expected, start=1):
        r = await row(world, t)
        world.clock.set(r.due_at)
        now = world.clock.now()
        async with world.deps.db.write() as conn:
            (c,) = await timers.claim_due(conn, now=now, limit=10, lease=LEASE)
            assert c.attempts == attempt
            changed = await timers.retry(conn, [c], error=f"error {attempt}", now=now)
        assert changed == 1
        r = await row(world, t)
        assert r.state == "scheduled"
        assert r.attempts == attempt
        assert r.due_at == now + timedelta(seconds=seconds), attempt
        assert r.last_error == f"error {attempt}"
        assert r.lease_until is None and r.claim_token is None
        assert r.stuck is (attempt >= 5), attempt
        assert r.deadline_at != r.due_at  # the business deadline is kept
        async with world.deps.db.read() as conn:
            assert await timers.stuck(conn) == (1 if attempt >= 5 else 0)
        # Not claimable before its backoff runs out.
        async with world.deps.db.write() as conn:
            early = now + timedelta(seconds=seconds) - timedelta(microseconds=1)
            assert await timers.claim_due(conn, now=early, limit=10, lease=LEASE) == []


async def test_retry_needs_the_claim_and_truncates_the_error(world):
    (o,) = await make_orders(world, 1)
    (t,) = await schedule(world, (o, K.CANCEL_UNPAID, timedelta(0)))
    now = world.clock.now()
    async with world.deps.db.write() as conn:
        (c,) = await timers.claim_due(conn, now=now, limit=10, lease=LEASE)
        stale = timers.Claimed(**{**c.__dict__, "token": "stale"})
        assert await timers.retry(conn, [stale], error="nope", now=now) == 0
        assert await timers.retry(conn, [c], error="e" * 5000, now=now) == 1
        # Handed back already: a second retry with the same claim does nothing.
        assert await timers.retry(conn, [c], error="twice", now=now) == 0
    r = await row(world, t)
    assert r.last_error == "e" * 2000
    assert r.due_at == now + timedelta(seconds=30)


async def test_release_claims_hands_back_without_counting_the_attempt(world):
    o1, o2, o3 = await make_orders(world, 3)
    t1, t2, t3 = await schedule(
        world,
        (o1, K.CANCEL_UNPAID, timedelta(0)),
        (o2, K.PAY_REMINDER, timedelta(0)),
        (o3, K.CANCEL_UNPAID, timedelta(0)),
    )
    before = await rows(world)
    now = world.clock.now()
    async with world.deps.db.write() as conn:
        first = await timers.claim_ids(conn, [t1, t2], now=now, lease=LEASE)
        second = await timers.claim_ids(conn, [t3], now=now, lease=LEASE)
    async with world.deps.db.write() as conn:
        assert await timers.finish(conn, {t3: "done"}, token=second[0].token, now=now) == 1
        released = await timers.release_claims(conn, [*first, *second])
    assert released == 2  # t3 is done: not handed back
    after = await rows(world)
    for tid in (t1, t2):
        assert after[tid].state == "scheduled"
        assert after[tid].attempts == 0
        assert after[tid].due_at == before[tid].due_at
        assert after[tid].claim_token is None and after[tid].lease_until is None
    assert after[t3].state == "done" and after[t3].attempts == 1
    async with world.deps.db.write() as conn:
        again = await timers.claim_due(conn, now=now, limit=10, lease=LEASE)
    assert sorted(c.id for c in again) == [t1, t2]
    assert all(c.attempts == 1 for c in again)


async def test_claim_overdue_walks_missed_and_expired_claims_in_order(world):
    ids = await make_orders(world, 6)
    # ids: a (due -10m), b (due -8m, claimed: lease expires), c (due -8m), d (due -2s, within
    # the cutoff's grace), e (due -9m, claimed with a live lease), f (done, due -20m).
    a, b, c, d, e, f = await schedule(
        world,
        (ids[0], K.CANCEL_UNPAID, timedelta(0)),
        (ids[1], K.CANCEL_UNPAID, timedelta(minutes=2)),
        (ids[2], K.CANCEL_UNPAID, timedelta(minutes=2)),
        (ids[3], K.CANCEL_UNPAID, timedelta(minutes=10) - timedelta(seconds=2)),
        (ids[4], K.CANCEL_UNPAID, timedelta(minutes=1)),
        (ids[5], K.CANCEL_UNPAID, timedelta(0)),
    )
    await set_state(world, f, TimerState.DONE)
    world.clock.advance(timedelta(minutes=2))
    async with world.deps.db.write() as conn:
        (cb,) = await timers.claim_ids(conn, [b], now=world.clock.now(), lease=LEASE)
    world.clock.advance(timedelta(minutes=7, seconds=30))
    async with world.deps.db.write() as conn:
        (ce,) = await timers.claim_ids(conn, [e], now=world.clock.now(), lease=LEASE)
    world.clock.advance(timedelta(seconds=30))  # now = start + 10m: b's lease expired, e's not
    now = world.clock.now()
    cutoff = now - timedelta(seconds=5)

    walked: list[list[int]] = []
    after = None
    for _ in range(10):
        async with world.deps.db.write() as conn:
            claimed, after = await timers.claim_overdue(
                conn, now=now, cutoff=cutoff, after=after, limit=1, lease=LEASE
            )
        if after is None:
            assert claimed == []
            break
        walked.append([x.id for x in claimed])
    assert after is None
    assert walked == [[a], [b], [c]]  # (due_at, id): a first, then b before c on the tie
    stored = await rows(world)
    assert stored[a].state == stored[c].state == "claimed"
    assert stored[a].attempts == stored[c].attempts == 1
    assert stored[b].state == "claimed"
    assert stored[b].attempts == 2
    assert stored[b].claim_token != cb.token
    assert stored[b].lease_until == now + LEASE
    assert stored[d].state == "scheduled" and stored[d].attempts == 0
    assert stored[e].claim_token == ce.token and stored[e].attempts == 1
    assert stored[f].state == "done"

    # The old holder of b lost its fence.
    async with world.deps.db.write() as conn:
        assert await timers.finish(conn, {b: "late"}, token=cb.token, now=now) == 0


async def test_claim_overdue_cursor_skips_what_it_has_passed(world):
    o1, o2, o3 = await make_orders(world, 3)
    t1, t2, t3 = await schedule(
        world,
        (o1, K.CANCEL_UNPAID, timedelta(0)),
        (o2, K.CANCEL_UNPAID, timedelta(0)),
        (o3, K.CANCEL_UNPAID, timedelta(seconds=1)),
    )
    world.clock.advance(timedelta(minutes=1))
    now = world.clock.now()
    r1 = await row(world, t1)
    async with world.deps.db.write() as conn:
        claimed, after = await timers.claim_overdue(
            conn, now=now, cutoff=now, after=(r1.due_at, t1), limit=10, lease=LEASE
        )
    assert [c.id for c in claimed] == [t2, t3]
    assert after == ((await row(world, t3)).due_at, t3)
    assert (await row(world, t1)).state == "scheduled"
    async with world.deps.db.write() as conn:
        assert await timers.claim_overdue(
            conn, now=now, cutoff=now, after=after, limit=10, lease=LEASE
        ) == ([], None)


async def test_cancel_for_orders_touches_only_scheduled_timers(world):
    o1, o2, o3 = await make_orders(world, 3)
    sched, remind, claimed, done, other = await schedule(
        world,
        (o1, K.CANCEL_UNPAID, timedelta(minutes=30)),
        (o1, K.PAY_REMINDER, timedelta(minutes=5)),
        (o2, K.CANCEL_UNPAID, timedelta(0)),
        (o2, K.PAY_REMINDER, timedelta(0)),
        (o3, K.CANCEL_UNPAID, timedelta(minutes=30)),
    )
    now = world.clock.now()
    async with world.deps.db.write() as conn:
        await timers.claim_ids(conn, [claimed], now=now, lease=LEASE)
    await set_state(world, done, TimerState.DONE)
    before = await rows(world)
    world.clock.advance(1)
    later = world.clock.now()

    async with world.deps.db.write() as conn:
        assert await timers.cancel_for_orders(conn, [], later) == 0
        n = await timers.cancel_for_orders(
            conn, [o1, o2], later, kinds=[K.PAY_REMINDER], reason="paid"
        )
    assert n == 1
    after = await rows(world)
    assert (after[remind].state, after[remind].outcome, after[remind].done_at) == (
        "cancelled",
        "paid",
        later,
    )
    assert after[sched] == before[sched]

    async with world.deps.db.write() as conn:
        n = await timers.cancel_for_orders(conn, [o1, o2], later)
    assert n == 1
    after = await rows(world)
    assert after[sched].state == "cancelled" and after[sched].outcome == "order moved on"
    assert after[claimed] == before[claimed]  # a claimed timer finishes on its own
    assert after[done] == before[done]
    assert after[other] == before[other]


async def test_next_due_at_is_the_earliest_scheduled(world):
    async with world.deps.db.read() as conn:
        assert await timers.next_due_at(conn) is None
    o1, o2 = await make_orders(world, 2)
    t1, _t2 = await schedule(
        world,
        (o1, K.CANCEL_UNPAID, timedelta(minutes=1)),
        (o2, K.CANCEL_UNPAID, timedelta(minutes=7)),
    )
    start = world.clock.now()
    async with world.deps.db.read() as conn:
        assert await timers.next_due_at(conn) == start + timedelta(minutes=1)
    world.clock.advance(timedelta(minutes=1))
    async with world.deps.db.write() as conn:
        await timers.claim_ids(conn, [t1], now=world.clock.now(), lease=LEASE)
    async with world.deps.db.read() as conn:
        due = await timers.next_due_at(conn)
    assert due == start + timedelta(minutes=7)
    assert due.tzinfo is not None


async def test_counts_by_state_overdue_and_stuck(world):
    ids = await make_orders(world, 5)
    _a, b, c, _d, e = await schedule(
        world,
        (ids[0], K.CANCEL_UNPAID, timedelta(0)),
        (ids[1], K.CANCEL_UNPAID, timedelta(0)),
        (ids[2], K.CANCEL_UNPAID, timedelta(minutes=1)),
        (ids[3], K.CANCEL_UNPAID, timedelta(minutes=59, seconds=58)),
        (ids[4], K.CANCEL_UNPAID, timedelta(0)),
    )
    await set_state(world, e, TimerState.DONE)
    async with world.deps.db.write() as conn:
        await timers.claim_ids(conn, [b], now=world.clock.now(), lease=LEASE)
        await conn.execute(update(t_timers).where(t_timers.c.id.in_([c, e])).values(stuck=True))
    world.clock.advance(timedelta(hours=1))
    now = world.clock.now()
    async with world.deps.db.read() as conn:
        assert await timers.count_by_state(conn) == {"scheduled": 3, "claimed": 1, "done": 1}
        # a, b, c are more than 5 s overdue; d only 2 s; e is done.
        assert await timers.overdue(conn, now=now, grace=timedelta(seconds=5)) == 3
        assert await timers.overdue(conn, now=now, grace=timedelta(0)) == 4
        assert await timers.stuck(conn) == 1  # e is stuck but done
    # The dashboard's list: both live states, oldest due first, each with its order's status.
    listed = await operations.overdue_timers(world.deps, 20)
    assert [t["id"] for t in listed] == [_a, b, c]
    assert {t["order_status"] for t in listed} == {"pending_payment"}
    assert [t["id"] for t in await operations.overdue_timers(world.deps, 2)] == [_a, b]


async def test_rearm_puts_a_claim_back_at_a_later_time_uncounted(world):
    (o,) = await make_orders(world, 1)
    (t,) = await schedule(world, (o, K.CANCEL_UNPAID, timedelta(0)))
    now = world.clock.now()
    later = now + timedelta(minutes=10)
    async with world.deps.db.write() as conn:
        (c,) = await timers.claim_due(conn, now=now, limit=1, lease=LEASE)
        stale = timers.Claimed(**{**c.__dict__, "token": "stale"})
        assert await timers.rearm(conn, stale, due_at=later) == 0
        assert await timers.rearm(conn, c, due_at=later) == 1
    r = await row(world, t)
    assert (r.state, r.due_at, r.attempts, r.claim_token) == ("scheduled", later, 0, None)


def test_quick_backoff_doubles_from_two_seconds_to_thirty_then_backs_off_as_usual():
    from dueflow.domain.timers import backoff, quick_backoff

    quick = [quick_backoff(a).total_seconds() for a in range(1, 12)]
    assert quick == [2, 4, 8, 16, 30, 30, 30, 30, 60, 120, 240]
    assert sum(quick[:8]) > 120  # past the providers' two-minute margin on the quick schedule
    assert quick_backoff(0) == quick_backoff(1)
    assert quick_backoff(40) == backoff(40)  # both at the 10 minute cap
