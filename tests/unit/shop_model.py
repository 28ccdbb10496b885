"""The pure-Python model of the shop that tests/unit/test_shop_model.py holds dueflow to
(tests/unit/shop_rows.py reads the database as this model says it).

The model is what the issue says, not what the code does: an order takes units of SKUs (and of
a flash sale) and maybe a coupon, all or nothing; paying sells the units and uses the coupon;
every cancel before payment puts the units back, gives the coupon back (expired if its validity
ended) and lowers the buyer's flash count; a paid order cancelled unshipped keeps everything
where it is and gets a refund; every cancel tells the buyer once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from dueflow.exceptions import (
    CouponUnusable,
    InvalidInput,
    NotAllowed,
    NotFound,
    OutOfStock,
    PurchaseLimitExceeded,
    SalesClosed,
)

CENT = Decimal("0.01")
#: How long each order type's stages last (the prod profile's defaults).
PAY = {"shop": timedelta(minutes=15), "flash": timedelta(minutes=5)}
REMINDER = {"shop": timedelta(minutes=5), "flash": timedelta(minutes=2)}
SHIP = timedelta(days=3)
RECEIVE = timedelta(days=10)
PAID = ("pending_shipment", "shipped", "completed", "cancelled_unshipped")
CANCELLED = ("cancelled_unpaid", "cancelled_unshipped")
#: The timer kind each stage waits on.
STAGE_OF = {
    "pay_reminder": "pending_payment",
    "cancel_unpaid": "pending_payment",
    "cancel_unshipped": "pending_shipment",
    "confirm_receipt": "shipped",
}


@dataclass
class MSku:
    id: int
    seller: int
    title: str
    price: Decimal
    stock: int
    held: int = 0
    sold: int = 0
    stocked: int = 0

    def counts(self) -> tuple[int, int, int, int]:
        return (self.stock, self.held, self.sold, self.stocked)


@dataclass
class MSale(MSku):
    sku: int = 0
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    limit: int = 0


@dataclass
class MTemplate:
    id: int
    seller: int
    title: str
    off: Decimal
    minimum: Decimal
    valid_from: datetime
    valid_until: datetime
    total: int
    issued: int = 0


@dataclass
class MCoupon:
    id: int
    template: MTemplate
    owner: int
    state: str = "available"  # the row's state: available, locked, used, expired
    order: int | None = None

    def state_at(self, now: datetime) -> str:
        """As its owner sees it: an available one past its validity is expired."""
        if self.state == "available" and self.template.valid_until <= now:
            return "expired"
        return self.state


#: (kind, item id, label, price each, quantity): one order line.
Line = tuple[str, int, str, Decimal, int]


@dataclass
class MOrder:
    id: int
    order_type: str  # shop | flash
    buyer: int
    seller: int
    lines: list[Line]
    amount: Decimal
    pay_deadline: datetime
    status: str = "pending_payment"
    paid_at: datetime | None = None
    ship_deadline: datetime | None = None
    receive_deadline: datetime | None = None
    cancel_reason: str | None = None
    timers: dict[str, tuple[str, datetime]] = field(default_factory=dict)  # kind: (state, due)
    paid_attempts: int = 0
    refunds: int = 0
    discrepancies: list[str] = field(default_factory=list)
    reminders: dict[str, str] = field(default_factory=dict)  # kind: state
    events: list[str] = field(default_factory=list)

    def units(self, kind: str) -> dict[int, int]:
        found: dict[int, int] = defaultdict(int)
        for k, item, _, _, quantity in self.lines:
            if k == kind:
                found[item] += quantity
        return dict(found)

    @property
    def coupon(self) -> int | None:
        return next((item for k, item, *_ in self.lines if k == "coupon"), None)


@dataclass
class Model:
    now: datetime
    skus: dict[int, MSku]
    sales: dict[int, MSale]
    templates: dict[int, MTemplate]
    coupons: dict[int, MCoupon] = field(default_factory=dict)
    orders: dict[int, MOrder] = field(default_factory=dict)
    flash_buyers: dict[tuple[int, int], int] = field(default_factory=dict)
    #: Notices the notifier was asked to send: (order, kind, reason).
    sent: Counter[tuple[int, str, str | None]] = field(default_factory=Counter)

    # -- placing: what the service says, in the order it checks

    def shop_refusal(
        self, buyer: int, wanted: dict[int, int], coupon_id: int | None
    ) -> type[Exception] | None:
        sellers = {self.skus[s].seller for s in wanted}
        if len(sellers) > 1:
            return InvalidInput
        if sellers == {buyer}:
            return NotAllowed
        if any(self.skus[s].stock < q for s, q in sorted(wanted.items())):
            return OutOfStock
        if coupon_id is None:
            return None
        c = self.coupons.get(coupon_id)
        if c is None:
            return NotFound
        if c.owner != buyer:
            return NotAllowed
        total = self.total(wanted)
        if (
            c.state_at(self.now) != "available"
            or c.template.valid_from > self.now
            or c.template.seller not in sellers
            or total < c.template.minimum
        ):
            return CouponUnusable
        return None

    def flash_refusal(self, buyer: int, sale_id: int, quantity: int) -> type[Exception] | None:
        sale = self.sales.get(sale_id)
        if sale is None:
            return NotFound
        assert sale.starts_at is not None and sale.ends_at is not None
        if not sale.starts_at <= self.now < sale.ends_at:
            return SalesClosed
        if sale.stock < quantity:
            return OutOfStock
        if sale.seller == buyer:
            return NotAllowed
        if self.skus[sale.sku].stock < quantity:
            return OutOfStock
        if self.flash_buyers.get((sale_id, buyer), 0) + quantity > sale.limit:
            return PurchaseLimitExceeded
        return None

    def total(self, wanted: dict[int, int]) -> Decimal:
        return sum((self.skus[s].price * q for s, q in wanted.items()), start=Decimal(0))

    def place_shop(
        self, order_id: int, buyer: int, wanted: dict[int, int], coupon_id: int | None
    ) -> MOrder:
        lines: list[Line] = [
            ("sku", s, self.skus[s].title, self.skus[s].price, q) for s, q in sorted(wanted.items())
        ]
        amount = self.total(wanted)
        if coupon_id is not None:
            c = self.coupons[coupon_id]
            lines.append(("coupon", c.id, c.template.title, c.template.off, 1))
            amount -= c.template.off
            c.state, c.order = "locked", order_id
        seller = self.skus[next(iter(wanted))].seller
        return self._place(order_id, "shop", buyer, seller, lines, max(amount, CENT))

    def place_flash(self, order_id: int, buyer: int, sale_id: int, quantity: int) -> MOrder:
        sale = self.sales[sale_id]
        sku = self.skus[sale.sku]
        lines: list[Line] = [
            ("sku", sku.id, sku.title, sale.price, quantity),
            ("flash", sale.id, f"flash sale {sale.id}", Decimal("0.00"), quantity),
        ]
        key = (sale_id, buyer)
        self.flash_buyers[key] = self.flash_buyers.get(key, 0) + quantity
        return self._place(order_id, "flash", buyer, sale.seller, lines, sale.price * quantity)

    def _place(
        self,
        order_id: int,
        order_type: str,
        buyer: int,
        seller: int,
        lines: list[Line],
        amount: Decimal,
    ) -> MOrder:
        assert order_id not in self.orders
        o = MOrder(order_id, order_type, buyer, seller, lines, amount, self.now + PAY[order_type])
        o.timers = {
            "cancel_unpaid": ("scheduled", o.pay_deadline),
            "pay_reminder": ("scheduled", self.now + REMINDER[order_type]),
        }
        for table, kind in ((self.skus, "sku"), (self.sales, "flash")):
            for item, q in o.units(kind).items():
                row = table[item]
                assert row.stock >= q
                row.stock, row.held = row.stock - q, row.held + q
        self.orders[order_id] = o
        return o

    # -- moves

    def _cancel_timers(self, o: MOrder) -> None:
        for kind, (state, due) in o.timers.items():
            if state == "scheduled":
                o.timers[kind] = ("cancelled", due)

    def _closed(self, o: MOrder, reason: str) -> None:
        o.cancel_reason = reason
        self._cancel_timers(o)
        o.timers["order_closed"] = ("scheduled", self.now)

    def cancel_unpaid(self, o: MOrder, reason: str) -> None:
        assert o.status == "pending_payment"
        o.status = "cancelled_unpaid"
        for table, kind in ((self.skus, "sku"), (self.sales, "flash")):
            for item, q in o.units(kind).items():
                row = table[item]
                row.stock, row.held = row.stock + q, row.held - q
        for sale_id, q in o.units("flash").items():
            self.flash_buyers[(sale_id, o.buyer)] -= q
        if o.coupon is not None:
            c = self.coupons[o.coupon]
            assert (c.state, c.order) == ("locked", o.id)
            c.state = "expired" if c.template.valid_until <= self.now else "available"
            c.order = None
        self._closed(o, reason)
        o.events += [reason, "released"]

    def pay(self, o: MOrder) -> str:
        o.paid_attempts += 1
        if o.status != "pending_payment":
            o.discrepancies.append("paid_after_cancel" if o.status in CANCELLED else "paid_twice")
            o.refunds += 1
            o.events += ["discrepancy", "refund_created"]
            return "refund"
        o.status, o.paid_at, o.ship_deadline = "pending_shipment", self.now, self.now + SHIP
        for table, kind in ((self.skus, "sku"), (self.sales, "flash")):
            for item, q in o.units(kind).items():
                row = table[item]
                row.held, row.sold = row.held - q, row.sold + q
        if o.coupon is not None:
            c = self.coupons[o.coupon]
            assert (c.state, c.order) == ("locked", o.id)
            c.state = "used"
        self._cancel_timers(o)
        o.timers["cancel_unshipped"] = ("scheduled", o.ship_deadline)
        o.events.append("pay")
        return "confirmed"

    def cancel_unshipped(self, o: MOrder, reason: str) -> None:
        """Nothing moves back (units stay sold, the coupon used); every paid attempt is
        refunded once."""
        assert o.status == "pending_shipment"
        o.status = "cancelled_unshipped"
        created, o.refunds = o.paid_attempts - o.refunds, o.paid_attempts
        self._closed(o, reason)
        o.events += [reason, "released"] + ["refund_created"] * created

    def ship(self, o: MOrder) -> None:
        o.status, o.receive_deadline = "shipped", self.now + RECEIVE
        self._cancel_timers(o)
        o.timers["confirm_receipt"] = ("scheduled", o.receive_deadline)
        o.events.append("ship")

    def complete(self, o: MOrder, event: str) -> None:
        o.status = "completed"
        self._cancel_timers(o)
        o.events.append(event)

    def restock(self, sku_id: int, quantity: int) -> None:
        sku = self.skus[sku_id]
        sku.stock, sku.stocked = sku.stock + quantity, sku.stocked + quantity

    # -- timers

    def fire(self, o: MOrder, kind: str) -> None:
        """A scheduled, due timer runs its handler."""
        state, due = o.timers[kind]
        assert state == "scheduled" and due <= self.now, (o.id, kind, state, due)
        o.timers[kind] = ("done", due)
        if kind == "order_closed":
            assert o.status in CANCELLED
            o.reminders[kind] = "sent"
            self.sent[(o.id, kind, o.cancel_reason)] += 1
            return
        assert o.status == STAGE_OF[kind], (o.id, kind, o.status)
        if kind == "pay_reminder":
            if o.pay_deadline > self.now:
                o.reminders[kind] = "sent"
                self.sent[(o.id, kind, None)] += 1
        elif kind == "cancel_unpaid":
            self.cancel_unpaid(o, "pay_timeout")
        elif kind == "cancel_unshipped":
            self.cancel_unshipped(o, "ship_timeout")
        else:
            self.complete(o, "receive_timeout")

    def due(self, cutoff: datetime) -> list[tuple[datetime, int, str]]:
        return sorted(
            (due, o.id, kind)
            for o in self.orders.values()
            for kind, (state, due) in o.timers.items()
            if state == "scheduled" and due <= cutoff
        )

    def run_due(self, cutoff: datetime) -> int:
        """Fire every timer due by ``cutoff``, earliest first, and those the firing makes due
        (a drain, or a scanner's pass with ``cutoff`` before now). Within one batch the worker
        runs kinds in another order, which changes nothing: the only two kinds of one order
        due together are its reminder and its cancel, and then its deadline has passed, so
        the reminder is skipped either way."""
        fired = 0
        while todo := self.due(cutoff):
            _, order_id, kind = todo[0]
            self.fire(self.orders[order_id], kind)
            fired += 1
        return fired

    def snapshot(self) -> dict[str, Any]:
        mine = self.orders.values()
        return {
            "orders": {o.id: (o.order_type, o.buyer, o.seller, *stages(o)) for o in mine},
            "lines": {o.id: o.lines for o in mine},
            "skus": {s.id: s.counts() for s in self.skus.values()},
            "sales": {s.id: s.counts() for s in self.sales.values()},
            "flash_buyers": dict(self.flash_buyers),
            "coupons": {
                c.id: (c.template.id, c.owner, c.state, c.order) for c in self.coupons.values()
            },
            "issued": {t.id: t.issued for t in self.templates.values()},
            "timers": {
                (o.id, kind): (state, due, 1 if state == "done" else 0)
                for o in mine
                for kind, (state, due) in o.timers.items()
            },
            "reminders": {(o.id, k): s for o in mine for k, s in o.reminders.items()},
            "paid_attempts": {o.id: o.paid_attempts for o in mine if o.paid_attempts},
            "refunds": {o.id: o.refunds for o in mine if o.refunds},
            "discrepancies": sorted((o.id, k) for o in mine for k in o.discrepancies),
            "events": {o.id: o.events for o in mine},
        }


def stages(o: Any) -> tuple[Any, ...]:
    """What the model and the orders table must agree on besides the parties (a model order
    and an orders row name these alike)."""
    return (
        o.amount,
        o.status,
        o.cancel_reason,
        o.pay_deadline,
        o.paid_at,
        o.ship_deadline,
        o.receive_deadline,
    )
