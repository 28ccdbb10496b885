"""The chaos soak's invariant checker: run once at the end of each soak leg, after the load has
stopped and the fleet has settled, it reads dueflow's database, the payment simulator's state and
what the soak's webhook receiver recorded, and checks every promise of issue 14.

Each promise is one check: how many things it looked at, how many broke it, and the evidence
(ids, times, states) of the first few that did. A check that looked at nothing says so
(``checked`` 0) so that the caller can fail it: a promise never exercised is no promise kept.

The checker writes nothing. It reuses :func:`dueflow.service.report.check_invariants` for the
holding, stock, coupon, seat and review promises, and adds what that lacks: lateness against
the soak's bounds, money against the simulator, deliveries counted at the receiver.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select

from dueflow import bootstrap
from dueflow.config import Settings
from dueflow.domain.lifecycle import CANCELLED_STATUSES, LIFECYCLES, OrderEvent, OrderStatus
from dueflow.domain.timers import MESSAGES, TimerKind, TimerState
from dueflow.service import report
from dueflow.store import payments as pay_store
from dueflow.store import schema

#: Evidence lines kept per check: enough to start from, short enough to read.
MAX_EVIDENCE = 20
#: A reminder checked and then frozen with its worker (SIGSTOP) before the send goes out when
#: the worker resumes, however long after the payment: the order was checked, the send was on
#: its way. Counted in the figures (``reminders_sent_through_a_freeze``), not a violation; a
#: receiver that must never show a paid order's reminder checks the order's status.
#: A pay reminder already on its way when the order was paid or cancelled may land this late:
#: the worker checks the order right before the send, and the send may take up to the notifier's
#: timeout (5 s) to arrive; the receiver also shares its process with the load generator.
IN_FLIGHT = timedelta(seconds=5)
#: How long after its expiry a payment attempt whose start was never answered (the API process
#: killed mid-call, the call timed out) holds its order's cancel: the providers' "no such trade"
#: proves nothing until then (dueflow's clock-skew margin for both providers, docs/payments.md).
UNANSWERED_START_MARGIN = timedelta(minutes=2)
#: The longest step of the retries meanwhile (dueflow.domain.timers.quick_backoff): the try
#: that finds the trade decidable comes at most this long after it became so.
RETRY_STEP = timedelta(seconds=30)
#: The timer kinds and the order events an unanswered start may hold back.
HELD_BY_START = frozenset({TimerKind.CANCEL_UNPAID.value, OrderEvent.PAY_TIMEOUT.value})
#: The timer kinds that act on a business deadline (the promise "acted on by deadline + scan
#: interval + lease"). The others (notices, closes, refund checks, show cancels) are measured
#: for the lateness figures only.
DEADLINE_KINDS = frozenset(
    {
        TimerKind.PAY_REMINDER.value,
        TimerKind.CANCEL_UNPAID.value,
        TimerKind.CANCEL_UNSHIPPED.value,
        TimerKind.CONFIRM_RECEIPT.value,
        TimerKind.AUTO_REVIEW.value,
    }
)
#: The deadline kinds that are messages (domain.timers.MESSAGES): their overload bound is looser.
MESSAGE_KINDS = frozenset(k.value for k in MESSAGES) & DEADLINE_KINDS
#: The order events a deadline causes, and the order column holding that deadline.
TIMEOUT_EVENTS = {
    OrderEvent.PAY_TIMEOUT.value: "pay_deadline",
    OrderEvent.SHIP_TIMEOUT.value: "ship_deadline",
    OrderEvent.RECEIVE_TIMEOUT.value: "receive_deadline",
    OrderEvent.REVIEW_TIMEOUT.value: "review_deadline",
}
#: Dueflow's refund states once a refund was approved (submitted to the provider) or closed.
REFUND_FINAL = frozenset(
    {
        pay_store.REFUND_SUCCEEDED,
        pay_store.REFUND_FAILED,
        pay_store.REFUND_REJECTED,
        pay_store.REFUND_SETTLED_OFFLINE,
    }
)
PROVIDERS = frozenset({"alipay", "wechatpay"})
CANCELLED = frozenset(s.value for s in CANCELLED_STATUSES)


@dataclass(frozen=True)
class Bounds:
    """How late a deadline may be acted on in this soak leg (the fleet's settings)."""

    scan_interval: float  # seconds (DUEFLOW_SCAN_INTERVAL)
    lease: float  # DUEFLOW_LEASE
    grace: float  # DUEFLOW_SCAN_GRACE
    slack: float = 3.0  # commit and processing time on a loaded 2-core machine
    early_tolerance: float = 0.2  # clock sync error between processes (seconds)
    #: An overload leg's bounds: how much later a must-happen deadline, and a message, may be.
    overload: float = 0.0
    message_overload: float = 0.0

    @property
    def late_limit(self) -> float:
        """The latest a deadline may be acted on in a quiet leg, in seconds after it: the
        scanner's next pass finds a timer whose worker died once its lease has run out."""
        return self.scan_interval + self.lease + self.grace + self.slack

    @property
    def must_limit(self) -> float:
        """The latest a must-happen deadline (a cancel, a receipt, a review) may be acted on."""
        return self.late_limit + self.overload

    @property
    def message_limit(self) -> float:
        """The latest a message (a pay reminder) may be sent."""
        return self.late_limit + self.message_overload

    def limit(self, kind: str) -> float:
        """The bound of a timer kind or a timeout event."""
        return self.message_limit if kind in MESSAGE_KINDS else self.must_limit


class _Check:
    """One promise being checked: counts what it looked at and keeps the first evidence."""

    def __init__(self, name: str, promise: str) -> None:
        self.name = name
        self.promise = promise
        self.checked = 0
        self.violations = 0
        self.evidence: list[str] = []

    def look(self, count: int = 1) -> None:
        """``count`` more things looked at."""
        self.checked += count

    def fail(self, evidence: str) -> None:
        """One more thing broke the promise; ``evidence`` names it."""
        self.violations += 1
        if len(self.evidence) < MAX_EVIDENCE:
            self.evidence.append(evidence)

    def result(self) -> dict[str, Any]:
        """The check as the caller reads it."""
        return {
            "name": self.name,
            "promise": self.promise,
            "checked": self.checked,
            "violations": self.violations,
            "evidence": list(self.evidence),
        }


@dataclass
class _Tables:
    """The rows the checks read, each table read once."""

    orders: dict[int, Mapping[str, Any]]
    events: list[Mapping[str, Any]]
    timers: list[Mapping[str, Any]]
    payments: dict[str, Mapping[str, Any]]
    refunds: list[Mapping[str, Any]]
    discrepancies: list[Mapping[str, Any]]
    reminders: dict[int, Mapping[str, Any]]
    counts: dict[str, int]
    goods: list[Mapping[str, Any]]
    seat_holds: list[Mapping[str, Any]]
    live_stream: bool


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _when(value: Any) -> datetime | None:
    """A time from the simulator or the receiver (ISO text), timezone-aware."""
    if value is None or value == "":
        return None
    found = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return found.replace(tzinfo=UTC) if found.tzinfo is None else found


def _tally(values: Iterable[Any]) -> dict[str, int]:
    return {str(k): n for k, n in sorted(Counter(str(v) for v in values).items())}


def _percentiles(values: list[float]) -> dict[str, float | int]:
    """p50, p99 and max (nearest rank) and how many; zeros when there are none."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0, "n": 0}

    def rank(q: float) -> float:
        index = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
        return round(ordered[index], 3)

    return {"p50": rank(0.5), "p99": rank(0.99), "max": round(ordered[-1], 3), "n": len(ordered)}


async def _read(conn: Any) -> _Tables:
    """Every row the checks need (the soak's tables are small enough to read whole)."""

    async def rows(table: Any) -> list[Mapping[str, Any]]:
        result = await conn.execute(select(table).order_by(*table.primary_key))
        return [r._mapping for r in result]

    counts = {}
    for name in ("goods", "seats", "seat_holds", "skus", "flash_sales", "coupons", "reviews"):
        table = schema.metadata.tables[name]
        counts[name] = int((await conn.execute(select(func.count()).select_from(table))).scalar())
    buyers = select(func.count()).select_from(schema.show_buyers)
    counts["show_buyers"] = int((await conn.execute(buyers)).scalar())
    streams = await rows(schema.event_deliveries)
    return _Tables(
        orders={int(r["id"]): r for r in await rows(schema.orders)},
        events=await rows(schema.order_events),
        timers=await rows(schema.timers),
        payments={str(r["pay_no"]): r for r in await rows(schema.payments)},
        refunds=await rows(schema.refunds),
        discrepancies=await rows(schema.discrepancies),
        reminders={int(r["id"]): r for r in await rows(schema.reminders)},
        counts=counts,
        goods=await rows(schema.goods),
        seat_holds=await rows(schema.seat_holds),
        live_stream=any(s["name"] == "live" for s in streams),
    )


def _settings(database_url: str) -> Settings:
    """Settings that reach nothing but the database: whatever the environment of the soak says,
    the checker builds no Redis, broker or webhook client."""
    return Settings(
        database_url=database_url,
        trigger_url="db",
        locks_url=None,
        seat_cache_url=None,
        notifier="log",
        events_webhook_url=None,
    )


async def check(
    database_url: str,
    simulator_state: dict[str, Any],
    deliveries: list[dict[str, Any]],
    bounds: Bounds,
    *,
    max_deliveries: int = 3,
    frozen: Sequence[tuple[datetime, datetime]] = (),
) -> dict[str, Any]:
    """Check every promise of issue 14 once, at the end of a soak leg. ``frozen``: when the
    chaos froze a worker (SIGSTOP to SIGCONT), for the reminders it held mid-send.

    ``now`` is the database's clock where it has one (PostgreSQL, MariaDB), this machine's on
    SQLite: the clock dueflow itself decided by. Returns the checks, the lateness of every done
    timer and the figures (JSON-able)."""
    async with bootstrap.running(_settings(database_url), migrate_sqlite=False) as deps:
        now = deps.clock.now()
        invariants = await report.check_invariants(deps)
        async with deps.db.report() as conn:
            tables = await _read(conn)
    notices = [d for d in deliveries if d.get("path") == "/notice"]
    events = [d for d in deliveries if d.get("path") == "/events"]
    lateness: list[dict[str, Any]] = []
    held = _invariant_checks(invariants, tables)
    checks = [
        *held.values(),
        _timers_on_time(tables, bounds, lateness, _first_received(notices)),
        _timeout_events_on_time(tables, bounds),
        _no_order_overdue(tables, bounds, now),
        _timers_settled(tables, bounds, now),
        _payments_accounted(tables, simulator_state),
        _refunds_once(tables, simulator_state),
        _refunds_final(tables, simulator_state),
    ]
    delivery_figures, notice_checks = _notice_checks(
        tables, notices, max_deliveries, held["cancels_notified"], frozen
    )
    checks += notice_checks
    if events or tables.live_stream:
        checks.append(_events_in_order(tables, events))
    delivery_figures["events"] = sum(1 for d in events if _delivered(d))
    delivery_figures["repeats"] += sum(
        1 for n in Counter(_delivery_id(d) for d in events if _delivered(d)).values() if n > 1
    )
    return {
        "checked_at": now.isoformat(),
        "checks": [c.result() for c in checks],
        "lateness": lateness,
        "figures": _figures(tables, simulator_state, lateness, delivery_figures),
    }


# --- the promises report.check_invariants keeps ------------------------------------------------

#: Each field of :class:`report.Invariants` the checker uses: its check, and what its ids are.
_INVARIANT_FIELDS: dict[str, tuple[str, str]] = {
    "held_by_dead_order": ("holds_released", "goods"),
    "seats_held_by_dead_order": ("holds_released", "order"),
    "units_held_by_dead_order": ("holds_released", "sku"),
    "flash_units_held_by_dead_order": ("holds_released", "flash sale"),
    "coupons_locked_by_dead_order": ("holds_released", "coupon"),
    "goods_held_twice": ("sold_once", "goods"),
    "seats_held_twice": ("sold_once", "seat"),
    "coupons_used_twice": ("sold_once", "coupon"),
    "units_sold_unpaid": ("sold_once", "sku"),
    "flash_units_sold_unpaid": ("sold_once", "flash sale"),
    "coupons_used_by_unpaid_order": ("sold_once", "coupon"),
    "coupons_not_with_their_order": ("sold_once", "order"),
    "units_unbalanced": ("stock_conserved", "sku"),
    "flash_units_unbalanced": ("stock_conserved", "flash sale"),
    "seat_limits_broken": ("stock_conserved", "show"),
    "flash_limits_broken": ("stock_conserved", "flash sale"),
    "reviews_twice": ("reviews_once", "order"),
    "cancels_not_notified": ("cancels_notified", "order"),
}
#: Paid and not cancelled: what a sold goods item or seat belongs to.
_PAID_LIVE = frozenset(
    {
        OrderStatus.PENDING_SHIPMENT.value,
        OrderStatus.SHIPPED.value,
        OrderStatus.RECEIVED.value,
        OrderStatus.COMPLETED.value,
        OrderStatus.PAID.value,
    }
)


def _invariant_checks(invariants: report.Invariants, tables: _Tables) -> dict[str, _Check]:
    """Holds, sales, stock and reviews: report.check_invariants' lists, and the goods and seat
    states it does not compare with their orders."""
    n = tables.counts
    found = {
        "holds_released": _Check(
            "holds_released",
            "Nothing (goods, seat, SKU or flash units, coupon) is held by a cancelled order.",
        ),
        "sold_once": _Check(
            "sold_once",
            "No goods, seat, unit or coupon is sold twice or sold to an order never paid.",
        ),
        "stock_conserved": _Check(
            "stock_conserved",
            "Stock is conserved: on sale + held + sold = stocked, buyers' counts match their "
            "orders and limits, every goods item in one known state.",
        ),
        "reviews_once": _Check("reviews_once", "No order has two reviews by the same role."),
    }
    found["holds_released"].look(
        n["goods"] + n["seat_holds"] + n["skus"] + n["flash_sales"] + n["coupons"]
    )
    found["sold_once"].look(n["goods"] + n["seats"] + n["skus"] + n["flash_sales"] + n["coupons"])
    found["stock_conserved"].look(n["goods"] + n["skus"] + n["flash_sales"] + n["show_buyers"])
    found["reviews_once"].look(n["reviews"])
    # cancels_notified counts what it looked at on the receiver's side (_notice_checks).
    found["cancels_notified"] = _Check(
        "cancels_notified",
        "Every cancelled order has one order_closed notice, and the receiver got it.",
    )
    for name, (check_name, what) in _INVARIANT_FIELDS.items():
        for item in getattr(invariants, name):
            found[check_name].fail(f"{what} {item}: {name.replace('_', ' ')}")
    _goods_and_seats(tables, found["sold_once"], found["stock_conserved"])
    return found


def _goods_and_seats(tables: _Tables, sold: _Check, stock: _Check) -> None:
    """A goods item sold belongs to exactly one paid order, a held one (on sale) to a live unpaid
    order, one off sale to nobody; a seat sold to a paid order, a seat held to an unpaid one."""
    paid_by_goods: dict[int, list[int]] = defaultdict(list)
    for order in tables.orders.values():
        if order["goods_id"] is not None and order["status"] in _PAID_LIVE:
            paid_by_goods[int(order["goods_id"])].append(int(order["id"]))
    unpaid = OrderStatus.PENDING_PAYMENT.value
    for item in tables.goods:
        gid, status, holder = int(item["id"]), item["status"], item["reserved_order_id"]
        buyers = paid_by_goods.get(gid, [])
        if status not in ("on_sale", "sold", "off_sale"):
            stock.fail(f"goods {gid}: unknown status {status}")
        if status == "sold" and len(buyers) != 1:
            sold.fail(f"goods {gid}: sold, paid orders {buyers}")
        if status == "on_sale" and buyers:
            sold.fail(f"goods {gid}: on sale again though orders {buyers} paid for it")
        if holder is not None:
            order = tables.orders.get(int(holder))
            state = None if order is None else order["status"]
            wanted = {"on_sale": {unpaid}, "sold": _PAID_LIVE}.get(status, set())
            if state not in wanted:
                stock.fail(f"goods {gid} ({status}): held by order {holder} ({state})")
    for hold in tables.seat_holds:
        order = tables.orders.get(int(hold["order_id"]))
        state = None if order is None else order["status"]
        wanted = _PAID_LIVE if hold["state"] == "sold" else {unpaid}
        if state not in wanted:
            sold.fail(
                f"seat {hold['seat_id']} of show {hold['show_id']}: {hold['state']} for order "
                f"{hold['order_id']} ({state})"
            )


# --- deadlines --------------------------------------------------------------------------------


def _unanswered_starts(tables: _Tables, bounds: Bounds) -> dict[int, datetime]:
    """Orders whose unpaid cancel a payment of unknown state held (an attempt whose start was
    never answered, or a cancel timer put back with "payment state unknown"), and the latest
    moment that cancel may come: the last attempt's expiry, the margin, and the late limit."""
    unknown = {
        int(t["order_id"])
        for t in tables.timers
        if t["kind"] == TimerKind.CANCEL_UNPAID.value
        and str(t["last_error"] or "").startswith("payment state unknown")
    }
    held: dict[int, datetime] = {}
    for payment in tables.payments.values():
        order_id = int(payment["order_id"])
        if payment["start_answer"] is None or order_id in unknown:
            until = payment["expires_at"] + UNANSWERED_START_MARGIN + RETRY_STEP
            until += timedelta(seconds=bounds.must_limit)
            held[order_id] = max(until, held.get(order_id, until))
    return held


def _too_late(
    kind: str,
    order_id: int,
    acted: datetime,
    late: float,
    bounds: Bounds,
    held: Mapping[int, datetime],
) -> bool:
    """Past the late limit, unless an unanswered payment start held this cancel (and it came
    within that hold's own limit)."""
    if late <= bounds.limit(kind):
        return False
    return not (kind in HELD_BY_START and order_id in held and acted <= held[order_id])


def _first_received(notices: Iterable[Mapping[str, Any]]) -> dict[tuple[int, str], datetime]:
    """When the receiver first took each order's reminder or notice (by order and type)."""
    first: dict[tuple[int, str], datetime] = {}
    for delivery in notices:
        body, at = _body(delivery), _when(delivery.get("at"))
        order_id = _order_of(body)
        if not _delivered(delivery) or at is None or order_id is None:
            continue
        key = (order_id, str(body.get("type")))
        first[key] = min(at, first.get(key, at))
    return first


#: The status each deadline timer acts on.
_AWAITS = {
    TimerKind.PAY_REMINDER.value: OrderStatus.PENDING_PAYMENT.value,
    TimerKind.CANCEL_UNPAID.value: OrderStatus.PENDING_PAYMENT.value,
    TimerKind.CANCEL_UNSHIPPED.value: OrderStatus.PENDING_SHIPMENT.value,
    TimerKind.CONFIRM_RECEIPT.value: OrderStatus.SHIPPED.value,
    TimerKind.AUTO_REVIEW.value: OrderStatus.RECEIVED.value,
}


def _moved_on(timer: Mapping[str, Any]) -> bool:
    """The timer found its order in another status than the one it acts on (paid before its
    cancel, shipped before its ship deadline ...): no action was due, so none was late. A
    reminder skipped because its order was still unpaid but past its pay deadline is no such
    case: it came too late to be sent."""
    outcome = str(timer["outcome"] or "")
    if not outcome.startswith("skipped: order is "):
        return False
    return outcome.removeprefix("skipped: order is ") != _AWAITS.get(timer["kind"])


def _limits(bounds: Bounds) -> str:
    """The deadline bounds as the promise states them."""
    if bounds.must_limit == bounds.message_limit:
        return f"{bounds.must_limit:g} s"
    return f"{bounds.must_limit:g} s (a pay reminder: {bounds.message_limit:g} s)"


def _timers_on_time(
    tables: _Tables,
    bounds: Bounds,
    lateness: list[dict[str, Any]],
    received: Mapping[tuple[int, str], datetime],
) -> _Check:
    """Every done timer's lateness (for the figures); the deadline kinds within the bounds (an
    unpaid cancel held by an unanswered payment start: within that hold's own limit)."""
    held = _unanswered_starts(tables, bounds)
    found = _Check(
        "timers_on_time",
        f"Every deadline timer (cancels, receipt, review; pay reminder) was done no earlier "
        f"than its deadline and at most {_limits(bounds)} after it (an unpaid cancel held by a "
        f"payment start never answered: by the attempt's expiry + 2 min + "
        f"{bounds.must_limit:g} s).",
    )
    for timer in tables.timers:
        if timer["state"] != TimerState.DONE.value or timer["done_at"] is None:
            continue
        late = (timer["done_at"] - timer["deadline_at"]).total_seconds()
        lateness.append(
            {
                "kind": timer["kind"],
                "order_id": int(timer["order_id"]),
                "deadline": _iso(timer["deadline_at"]),
                "acted": _iso(timer["done_at"]),
                "late_s": round(late, 6),
            }
        )
        if timer["kind"] not in DEADLINE_KINDS:
            continue
        found.look()
        order_id = int(timer["order_id"])
        if _moved_on(timer):
            continue  # nothing to act on: the order had left the status the timer waits for
        if timer["kind"] == TimerKind.PAY_REMINDER.value and timer["attempts"] > 1:
            # A reminder whose first send had no answer is sent again after the backoff (or
            # skipped once the order moved on), as documented: it acted when the receiver
            # first took it, or, never taken, at its first send, which the timer does not keep.
            first = received.get((order_id, "pay_reminder"))
            if (
                first is None
                or (first - timer["deadline_at"]).total_seconds() <= bounds.message_limit
            ):
                continue
        if late < -bounds.early_tolerance or _too_late(
            timer["kind"], order_id, timer["done_at"], late, bounds, held
        ):
            found.fail(
                f"timer {timer['id']} {timer['kind']} of order {timer['order_id']}: deadline "
                f"{_iso(timer['deadline_at'])}, done {_iso(timer['done_at'])} ({late:+.3f} s), "
                f"attempts {timer['attempts']}, outcome {timer['outcome']!r}, "
                f"last error {timer['last_error']!r}"
            )
    return found


def _timeout_events_on_time(tables: _Tables, bounds: Bounds) -> _Check:
    """Each timeout event of the timeline against the order's own deadline column (a pay
    timeout held by an unanswered payment start: within that hold's own limit)."""
    held = _unanswered_starts(tables, bounds)
    found = _Check(
        "timeouts_on_time",
        f"Every pay, ship, receive and review timeout happened no earlier than the order's "
        f"deadline and at most {bounds.must_limit:g} s after it (an unpaid cancel held by a "
        f"payment start never answered: by the attempt's expiry + 2 min + "
        f"{bounds.must_limit:g} s).",
    )
    for event in tables.events:
        column = TIMEOUT_EVENTS.get(event["event"])
        if column is None:
            continue
        found.look()
        order = tables.orders[int(event["order_id"])]
        deadline = order[column]
        if deadline is None:
            found.fail(f"order {order['id']}: {event['event']} at {_iso(event['at'])}, no {column}")
            continue
        late = (event["at"] - deadline).total_seconds()
        if late < -bounds.early_tolerance or _too_late(
            event["event"], int(order["id"]), event["at"], late, bounds, held
        ):
            found.fail(
                f"order {order['id']}: {event['event']} at {_iso(event['at'])}, {column} "
                f"{_iso(deadline)} ({late:+.3f} s)"
            )
    return found


def _no_order_overdue(tables: _Tables, bounds: Bounds, now: datetime) -> _Check:
    """No order still waits in a status whose deadline passed more than the bound ago."""
    found = _Check(
        "no_order_overdue",
        f"No order is left in a live status more than {bounds.must_limit:g} s past that "
        f"status's deadline.",
    )
    limit = timedelta(seconds=bounds.must_limit)
    for order in tables.orders.values():
        found.look()
        stage = LIFECYCLES[order["flow"]].stages.get(OrderStatus(order["status"]))
        deadline = None if stage is None else order[stage.deadline]
        if deadline is not None and deadline + limit < now:
            found.fail(
                f"order {order['id']} ({order['flow']}) still {order['status']}: "
                f"{stage.deadline if stage else ''} {_iso(deadline)}, checked at {_iso(now)}"
            )
    return found


def _timers_settled(tables: _Tables, bounds: Bounds, now: datetime) -> _Check:
    """No timer left claimed, or scheduled and due longer ago than a worker takes to claim, or
    parked (its handler gave up on it: a promise broken)."""
    found = _Check(
        "timers_settled",
        f"At the end no timer is claimed (or holds a lease), none is parked (its handler failed "
        f"on it every time) and none is scheduled with its due time more than "
        f"{bounds.grace + bounds.slack:g} s in the past.",
    )
    overdue = now - timedelta(seconds=bounds.grace + bounds.slack)
    for timer in tables.timers:
        found.look()
        state = timer["state"]
        where = (
            f"timer {timer['id']} {timer['kind']} of order {timer['order_id']}: {state}, due "
            f"{_iso(timer['due_at'])}, attempts {timer['attempts']}"
        )
        if state == TimerState.CLAIMED.value:
            found.fail(f"{where}, lease until {_iso(timer['lease_until'])}")
        elif state == TimerState.PARKED.value:
            found.fail(f"{where}, parked; last error {timer['last_error']!r}")
        elif state == TimerState.SCHEDULED.value and timer["lease_until"] is not None:
            found.fail(f"{where}, still leased until {_iso(timer['lease_until'])}")
        elif state == TimerState.SCHEDULED.value and timer["due_at"] < overdue:
            found.fail(f"{where}, overdue at {_iso(now)}; last error {timer['last_error']!r}")
    return found


# --- money ------------------------------------------------------------------------------------


def _pay_event_pay_nos(tables: _Tables) -> dict[int, str]:
    """The attempt each order was paid by: its ``pay`` event's detail names it
    (``<provider> <pay_no> <amount>``, docs/events.md)."""
    paid = {}
    for event in tables.events:
        if event["event"] == OrderEvent.PAY.value and event["detail"]:
            words = str(event["detail"]).split()
            if len(words) >= 2:
                paid.setdefault(int(event["order_id"]), words[1])
    return paid


def _payments_accounted(tables: _Tables, sim: dict[str, Any]) -> _Check:
    """Every trade the simulator took is the order's payment, or a discrepancy with a refund;
    every provider payment dueflow recorded paid was taken at the simulator."""
    found = _Check(
        "payments_accounted",
        "Every payment the simulator took is its order's payment, or a recorded discrepancy "
        "with a refund; every provider payment dueflow holds paid was taken by the simulator.",
    )
    paid_by = _pay_event_pay_nos(tables)
    flagged = {int(d["payment_id"]) for d in tables.discrepancies}
    refunded = {int(r["payment_id"]) for r in tables.refunds}
    taken = set()
    for trade in sim.get("trades", []):
        if trade.get("paid_at") is None:
            continue
        found.look()
        pay_no = str(trade["out_trade_no"])
        taken.add(pay_no)
        where = f"{trade['provider']} trade {pay_no} paid {trade['amount']} at {trade['paid_at']}"
        payment = tables.payments.get(pay_no)
        if payment is None:
            found.fail(f"{where}: no payment attempt has this pay_no")
            continue
        order_id = int(payment["order_id"])
        if payment["state"] != pay_store.PAID:
            found.fail(
                f"{where}: payment {payment['id']} of order {order_id} is {payment['state']}"
            )
            continue
        if Decimal(str(trade["amount"])) != Decimal(str(payment["amount"])):
            found.fail(f"{where}: payment {payment['id']} is for {payment['amount']}")
        if paid_by.get(order_id) == pay_no:
            continue
        returned = payment.get("provider_refunded")
        given_back = returned is not None and Decimal(str(returned)) >= Decimal(
            str(payment["amount"])
        )  # the provider gave it back itself (Alipay's cancel): no refund of ours is due
        if int(payment["id"]) not in flagged or not (int(payment["id"]) in refunded or given_back):
            status = tables.orders[order_id]["status"]
            found.fail(
                f"{where}: not the payment of order {order_id} ({status}, paid by "
                f"{paid_by.get(order_id)}), discrepancy "
                f"{'yes' if int(payment['id']) in flagged else 'none'}, refund "
                f"{'yes' if int(payment['id']) in refunded else 'none'}"
            )
    for pay_no, payment in tables.payments.items():
        if payment["provider"] in PROVIDERS and payment["state"] == pay_store.PAID:
            found.look()
            if pay_no not in taken:
                found.fail(
                    f"payment {payment['id']} {pay_no} of order {payment['order_id']}: paid in "
                    f"dueflow, no paid {payment['provider']} trade at the simulator"
                )
    return found


def _refunds_once(tables: _Tables, sim: dict[str, Any]) -> _Check:
    """The simulator's refunds: within each trade's amount, one success per trade, each refund
    number once, and each one a refund dueflow wrote for that trade's attempt."""
    found = _Check(
        "refunds_once",
        "No trade was refunded more than it was paid or succeeded twice, and every refund at "
        "the simulator is one dueflow wrote for that payment.",
    )
    trades = {(t["provider"], str(t["out_trade_no"])): t for t in sim.get("trades", [])}
    ours = {str(r["refund_no"]): r for r in tables.refunds}
    payment_ids = {int(p["id"]): pay_no for pay_no, p in tables.payments.items()}
    per_trade: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    per_number: Counter[str] = Counter()
    for refund in sim.get("refunds", []):
        found.look()
        key = (refund["provider"], str(refund["out_trade_no"]))
        per_trade[key].append(refund)
        per_number[str(refund["out_refund_no"])] += 1
        mine = ours.get(str(refund["out_refund_no"]))
        attempt = tables.payments.get(key[1])
        if (
            mine is None
            and str(refund["out_refund_no"]) == key[1]
            and attempt is not None
            and attempt.get("provider_refunded") is not None
        ):
            continue  # the provider's own refund (Alipay's cancel), recorded on the attempt
        if mine is None:
            found.fail(
                f"{key[0]} refund {refund['out_refund_no']} of trade {key[1]} "
                f"({refund['amount']}, {refund['status']}, reason {refund['reason']!r}): "
                f"dueflow has no refund with this number"
            )
        elif payment_ids.get(int(mine["payment_id"])) != key[1]:
            found.fail(
                f"refund {mine['id']} {mine['refund_no']}: refunded at the simulator on trade "
                f"{key[1]}, not on its payment {payment_ids.get(int(mine['payment_id']))}"
            )
    for key, refunds in per_trade.items():
        trade = trades.get(key)
        total = sum((Decimal(str(r["amount"])) for r in refunds), Decimal(0))
        nos = [str(r["out_refund_no"]) for r in refunds]
        if trade is None or trade.get("paid_at") is None:
            found.fail(f"{key[0]} trade {key[1]}: refunds {nos} of a trade never paid")
        elif total > Decimal(str(trade["amount"])):
            found.fail(f"{key[0]} trade {key[1]}: paid {trade['amount']}, refunded {total} {nos}")
        succeeded = [str(r["out_refund_no"]) for r in refunds if r["status"] == "success"]
        if len(succeeded) > 1:
            found.fail(f"{key[0]} trade {key[1]}: {len(succeeded)} refunds succeeded {succeeded}")
    for number, count in per_number.items():
        if count > 1:
            found.fail(f"refund number {number}: made {count} times at the simulator")
    return found


def _refunds_final(tables: _Tables, sim: dict[str, Any]) -> _Check:
    """Every refund an operator approved reached a final state, and agrees with the simulator."""
    found = _Check(
        "refunds_final",
        "Every approved refund reached a final state, succeeded exactly when the simulator "
        "paid it back.",
    )
    at_sim: dict[str, list[str]] = defaultdict(list)
    for refund in sim.get("refunds", []):
        at_sim[str(refund["out_refund_no"])].append(str(refund["status"]))
    for refund in tables.refunds:
        if refund["state"] == pay_store.REFUND_PENDING_REVIEW:
            continue
        found.look()
        states = at_sim.get(str(refund["refund_no"]), [])
        where = (
            f"refund {refund['id']} {refund['refund_no']} of order {refund['order_id']}: "
            f"{refund['state']} since {_iso(refund['updated_at'])}, at the simulator {states}"
        )
        if refund["state"] not in REFUND_FINAL:
            found.fail(f"{where}, last error {refund['last_error']!r}")
        elif (refund["state"] == pay_store.REFUND_SUCCEEDED) != ("success" in states):
            found.fail(where)
    return found


# --- deliveries -------------------------------------------------------------------------------


def _delivered(delivery: Mapping[str, Any]) -> bool:
    """Only a 2xx answer is a delivery."""
    return 200 <= int(delivery.get("status") or 0) < 300


def _delivery_id(delivery: Mapping[str, Any]) -> str:
    return str((delivery.get("headers") or {}).get("x-dueflow-delivery", ""))


def _body(delivery: Mapping[str, Any]) -> dict[str, Any]:
    """The delivered envelope (docs/events.md); empty when the body was no JSON object."""
    body = delivery.get("body")
    return body if isinstance(body, dict) else {}


def _order_of(body: Mapping[str, Any]) -> int | None:
    """The order an envelope is about: its ``order`` snapshot's id (None: no snapshot)."""
    order = body.get("order")
    return int(order["id"]) if isinstance(order, dict) and "id" in order else None


def _seq_of(body: Mapping[str, Any]) -> int:
    """An event envelope's seq, from its id ``evt_<seq>`` (0: no event's id)."""
    number = str(body.get("id") or "").removeprefix("evt_")
    return int(number) if number.isdigit() else 0


def _closing_times(tables: _Tables) -> dict[int, tuple[str, datetime]]:
    """When each order stopped awaiting payment (paid or cancelled): its first such event."""
    moved: dict[int, tuple[str, datetime]] = {}
    for event in sorted(tables.events, key=lambda e: (e["at"], e["id"])):
        order_id = int(event["order_id"])
        paid = event["event"] == OrderEvent.PAY.value
        if order_id not in moved and (paid or event["to_status"] in CANCELLED):
            moved[order_id] = (str(event["event"]), event["at"])
    return moved


def _notice_checks(
    tables: _Tables,
    notices: list[dict[str, Any]],
    max_deliveries: int,
    cancels: _Check,
    frozen: Sequence[tuple[datetime, datetime]],
) -> tuple[dict[str, int], list[_Check]]:
    """The notifier's deliveries as the receiver counted them: one reminder or notice per
    (order, kind), repeats only where dueflow knew it might have delivered, every cancel
    notified, no pay reminder after the order stopped awaiting payment."""
    once = _Check(
        "notices_once",
        f"No reminder or notice was received twice: one delivery id per order and kind, an id "
        f"received again only as a documented repeat (dueflow counted at least as many "
        f"deliveries, at most {max_deliveries}).",
    )
    received = [d for d in notices if _delivered(d)]
    per_id: Counter[str] = Counter(_delivery_id(d) for d in received)
    ids_per_notice: dict[tuple[Any, Any], set[str]] = defaultdict(set)
    for delivery in received:
        body = _body(delivery)
        ids_per_notice[(_order_of(body), body.get("type"))].add(_delivery_id(delivery))
    unexplained = 0
    for (order_id, event), ids in sorted(ids_per_notice.items(), key=str):
        if len(ids) > 1:
            once.fail(f"order {order_id}: {event} received under delivery ids {sorted(ids)}")
    for delivery_id, count in sorted(per_id.items()):
        once.look()
        body = _body(next(d for d in received if _delivery_id(d) == delivery_id))
        row = tables.reminders.get(int(delivery_id)) if delivery_id.isdigit() else None
        if row is None or (f"ntc_{row['id']}", row["order_id"], row["kind"]) != (
            body.get("id"),
            _order_of(body),
            body.get("type"),
        ):
            once.fail(
                f"delivery {delivery_id!r} ({body.get('id')} {body.get('type')} of order "
                f"{_order_of(body)}): no such reminder row"
                + ("" if row is None else f" (the row is {row['kind']} of order {row['order_id']})")
            )
            continue
        if count > 1 and (row["deliveries"] < count or count > max_deliveries):
            unexplained += 1
            once.fail(
                f"reminder {delivery_id} {row['kind']} of order {row['order_id']}: received "
                f"{count} times, dueflow counted {row['deliveries']} deliveries ({row['state']})"
            )
    closed = {_order_of(_body(d)) for d in received if _body(d).get("type") == "order_closed"}
    for order in tables.orders.values():
        if order["status"] in CANCELLED:
            cancels.look()
            if order["id"] not in closed:
                cancels.fail(
                    f"order {order['id']} {order['status']} at {_iso(order['cancelled_at'])} "
                    f"({order['cancel_reason']}): no order_closed notice received"
                )
    after = _Check(
        "reminders_not_after_close",
        "No pay reminder was received more than 5 s (a send in flight) after its order was "
        "paid or cancelled.",
    )
    moved = _closing_times(tables)
    thawed = 0
    for delivery in received:
        body = _body(delivery)
        if body.get("type") != TimerKind.PAY_REMINDER.value:
            continue
        after.look()
        at = _when(delivery.get("at"))
        closing = moved.get(_order_of(body) or 0)
        if at is not None and closing is not None and at > closing[1] + IN_FLIGHT:
            if any(start <= closing[1] and at <= end + IN_FLIGHT for start, end in frozen):
                thawed += 1  # checked, then frozen before the send: see FROZEN_SENDS
                continue
            after.fail(
                f"reminder {_delivery_id(delivery)} of order {_order_of(body)}: received "
                f"{at.isoformat()}, order {closing[0]} at {closing[1].isoformat()}"
            )
    figures = {
        "notices": len(received),
        "events": 0,
        "repeats": sum(1 for n in per_id.values() if n > 1),
        "repeats_unexplained": unexplained,
        "reminders_sent_through_a_freeze": thawed,
    }
    return figures, [once, after]


def _events_in_order(tables: _Tables, events: list[dict[str, Any]]) -> _Check:
    """The events webhook: every event delivered in seq order, none missing up to the last."""
    found = _Check(
        "events_in_order",
        "The events webhook delivered each event for the first time in increasing seq order, "
        "every seq up to the last delivered present and matching the timeline.",
    )
    by_seq = {int(e["seq"]): e for e in tables.events if e["seq"] is not None}
    skipped = {
        str(e["detail"]).split()[0]
        for e in tables.events
        if e["event"] == "event_skipped" and e["detail"]
    }
    highest = 0
    seen: set[int] = set()
    for delivery in events:
        if not _delivered(delivery):
            continue
        if (delivery.get("headers") or {}).get("x-dueflow-replay") == "true":
            continue
        body = _body(delivery)
        seq = _seq_of(body)
        if seq not in seen:
            found.look()
        if seq < highest and seq not in seen:
            # A repeat of an event already delivered (a sender frozen or killed before it heard
            # the answer) is the documented at-least-once: receivers drop it by its id.
            found.fail(f"evt_{seq} first received at {delivery.get('at')}, after evt_{highest}")
        row = by_seq.get(seq)
        if row is None or (row["order_id"], row["event"]) != (_order_of(body), body.get("type")):
            found.fail(
                f"evt_{seq} ({body.get('type')} of order {_order_of(body)}): the "
                f"timeline has {None if row is None else (row['event'], row['order_id'])}"
            )
        highest = max(highest, seq)
        seen.add(seq)
    for seq in range(1, highest + 1):
        if seq not in seen and f"evt_{seq}" not in skipped:
            row = by_seq.get(seq)
            found.fail(
                f"evt_{seq} never received before evt_{highest}"
                + ("" if row is None else f" ({row['event']} of order {row['order_id']})")
            )
    return found


# --- figures ----------------------------------------------------------------------------------


def _figures(
    tables: _Tables,
    sim: dict[str, Any],
    lateness: list[dict[str, Any]],
    deliveries: dict[str, int],
) -> dict[str, Any]:
    """The counts the soak's report shows beside the checks."""
    orders: dict[str, Counter[str]] = defaultdict(Counter)
    for order in tables.orders.values():
        orders[str(order["flow"])][str(order["status"])] += 1
    reminders: dict[str, Counter[str]] = defaultdict(Counter)
    for row in tables.reminders.values():
        reminders[str(row["kind"])][str(row["state"])] += 1
    per_kind: dict[str, list[float]] = defaultdict(list)
    for entry in lateness:
        per_kind[entry["kind"]].append(entry["late_s"])
    spread = {kind: _percentiles(values) for kind, values in sorted(per_kind.items())}
    spread["all"] = _percentiles([e["late_s"] for e in lateness])
    return {
        "orders": {flow: dict(sorted(n.items())) for flow, n in sorted(orders.items())},
        "timers": _tally(t["state"] for t in tables.timers),
        "sim_trades": _tally(t.get("status") for t in sim.get("trades", [])),
        "sim_refunds": _tally(r.get("status") for r in sim.get("refunds", [])),
        "payments": _tally(p["state"] for p in tables.payments.values()),
        "refunds": _tally(r["state"] for r in tables.refunds),
        "discrepancies": _tally(d["kind"] for d in tables.discrepancies),
        "reminders": {kind: dict(sorted(n.items())) for kind, n in sorted(reminders.items())},
        "deliveries": deliveries,
        "lateness": spread,
    }
