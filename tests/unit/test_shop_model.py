"""The shop under random interleavings, against the model of tests/unit/shop_model.py.

A hypothesis state machine runs one seller's three SKUs (a mug, pens, a single lamp), another
seller's tea, four coupon templates (5 off above 20, 30 off for the first 20 minutes, 2 off from
minute 10, the other seller's 1 off), two flash sales (the mug's, open for an hour, two a buyer;
the pens', from minute 30, one a buyer) and three buyers. It places shop orders (1-3 random
lines, repeats and the other seller's SKU among them, with the buyer's coupon, someone else's,
one that does not exist, or none) and flash orders, pays (in time, late, twice, the wrong
amount), cancels as buyer or seller, ships, confirms receipt, restocks, issues coupons, moves a
FakeClock around the reminders, the 15- and 5-minute pay deadlines, the coupons' validity, the
flash windows, the 3-day ship and 10-day receive deadlines, drains the worker, runs scanner
passes and delivers timer ids again. The model predicts each outcome (placed, or the refusal:
out of stock, over the limit, coupon unusable, ...) and after every step:

* the database equals the model: orders (status, reason, every deadline, amount), lines, every
  SKU's and flash sale's stock/held/sold/stocked, per-buyer flash counts, coupons (state,
  order), templates' issued counts, timers, reminders and notices, payments, refunds,
  discrepancies and every order's timeline;
* the shop's promises hold on the rows alone (shop_rows.structural_invariants): stock + held +
  sold = stocked, held = what unpaid orders hold, sold = what paid ones bought, never below
  zero; a coupon locked iff its order awaits payment, used iff it was paid, otherwise free;
  flash counts = held + bought units per buyer; the amount = lines minus the coupon; every
  cancelled order has one ``order_closed`` notice, scheduled or sent once;
* a copy drained at the same instant keeps ``check_invariants(tolerance_seconds=0)``, every
  cancelled order there was told exactly once (with its reason) and it equals the drained model.

``DUEFLOW_TEST_MODEL_EXAMPLES`` and ``DUEFLOW_TEST_MODEL_STEPS`` make a longer run.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from dueflow.exceptions import CouponUnusable, InvalidInput, NotAllowed, PaymentMismatch
from dueflow.service import accounts, payments, shop
from tests.conftest import START
from tests.unit import model_harness, shop_rows
from tests.unit import shop_model as m
from tests.unit.model_harness import FITTING, PICK, InOrderWorker, sent

BUYERS = 3
SELLER, OTHER_SELLER = BUYERS, BUYERS + 1  # indexes into the users
# (seller, title, price, stock)
SKUS = [
    (SELLER, "mug", "25.00", 6),
    (SELLER, "pen", "3.30", 8),
    (SELLER, "lamp", "99.99", 1),
    (OTHER_SELLER, "tea", "8.00", 5),
]
# (seller, title, off, minimum, valid from, valid until (after START), total)
TEMPLATES = [
    (SELLER, "5 off", "5.00", "20.00", timedelta(0), timedelta(days=1), 6),
    (SELLER, "30 off", "30.00", "0", timedelta(0), timedelta(minutes=20), 4),
    (SELLER, "2 off later", "2.00", "0", timedelta(minutes=10), timedelta(days=2), 2),
    (OTHER_SELLER, "1 off tea", "1.00", "0", timedelta(0), timedelta(days=1), 2),
]
# (buyer, template) issued before the first step
ISSUED = [(b, t) for b in range(BUYERS) for t in (0, 1)] + [(0, 2), (0, 3)]
# (sku, price, stock, starts, ends (after START), per-buyer limit)
SALES = [
    (0, "9.90", 4, timedelta(0), timedelta(days=4), 2),
    (1, "1.00", 3, timedelta(minutes=30), timedelta(hours=2), 1),
]
MISSING = 10**6  # an id nothing has

BUYER = st.sampled_from([0, 1, 2] * 3 + [SELLER])
LINES = st.lists(
    st.tuples(st.sampled_from([0, 0, 0, 1, 1, 1, 2, 3]), st.sampled_from([1, 1, 2, 3])),
    min_size=1,
    max_size=3,
)
COUPON = st.sampled_from(["none", "none", "mine", "mine", "mine", "mine", "other", "missing"])
OTHER = st.one_of(st.none(), st.integers(0, BUYERS + 1))  # None: the rightful party
# Moves of the clock: around the reminders (2 and 5 minutes), the pay deadlines (5 and 15),
# the 30-off coupon's end (20), the scanner's grace, any few minutes, and now and then hours
# or days (the ship and receive deadlines).
BOUNDARIES = [timedelta(seconds=s) for s in (1, 5, 6, 59, 119, 120, 121, 299, 300, 301, 899, 900)]
LONG = [timedelta(hours=1), timedelta(days=3), timedelta(days=3, seconds=1), timedelta(days=10)]
ADVANCE = st.one_of(
    st.sampled_from(BOUNDARIES),
    st.integers(1, 1200).map(lambda s: timedelta(seconds=s)),
    st.sampled_from(BOUNDARIES + LONG),
)


class ShopLife(model_harness.ModelMachine):
    name = "shop"
    worker_class = InOrderWorker
    clock_moves = ADVANCE
    others = OTHER

    def __init__(self) -> None:
        super().__init__()
        for buyer, template in ISSUED:
            self.issue(template=template, user=buyer, other=None)

    async def populate(self) -> None:
        names = [f"buyer{i}" for i in range(BUYERS)] + ["seller", "other-seller"]
        self.users = [(await accounts.add_user(self.deps, name))[0].id for name in names]
        self.model = m.Model(now=START, skus={}, sales={}, templates={})
        for seller, title, price, stock in SKUS:
            view = await shop.create_sku(
                self.deps, seller_id=self.users[seller], title=title, price=price, stock=stock
            )
            sku = m.MSku(view["id"], self.users[seller], title, Decimal(price), stock)
            sku.stocked = stock
            self.model.skus[sku.id] = sku
        self.sku_ids = sorted(self.model.skus)
        for seller, title, off, minimum, since, until, total in TEMPLATES:
            view = await shop.create_template(
                self.deps,
                seller_id=self.users[seller],
                title=title,
                amount_off=off,
                min_amount=minimum,
                valid_from=START + since,
                valid_until=START + until,
                total=total,
            )
            self.model.templates[view["id"]] = m.MTemplate(
                view["id"], self.users[seller], title, Decimal(off), Decimal(minimum),
                START + since, START + until, total,
            )  # fmt: skip
        self.template_ids = sorted(self.model.templates)
        for index, price, stock, starts, ends, limit in SALES:
            sku_id = self.sku_ids[index]
            view = await shop.create_flash_sale(
                self.deps,
                seller_id=self.model.skus[sku_id].seller,
                sku_id=sku_id,
                price=price,
                stock=stock,
                starts_at=START + starts,
                ends_at=START + ends,
                per_buyer_limit=limit,
            )
            seller_id = self.model.skus[sku_id].seller
            sale = m.MSale(view["id"], seller_id, "", Decimal(price), stock, stocked=stock)
            sale.sku, sale.starts_at, sale.ends_at, sale.limit = (
                sku_id, START + starts, START + ends, limit,
            )  # fmt: skip
            self.model.sales[sale.id] = sale
        self.sale_ids = [*sorted(self.model.sales), MISSING]

    def received(self, o: m.MOrder) -> None:
        self.model.complete(o, "confirm_receipt")

    # -- buyers (cancelling, confirming receipt) and sellers (shipping, cancelling) move as
    # model_harness.PARTY_MOVES says

    @initialize(
        first=st.lists(st.tuples(st.integers(0, BUYERS - 1), LINES, COUPON, PICK), max_size=3)
    )
    def some_orders(self, first: list[tuple[int, list[tuple[int, int]], str, int]]) -> None:
        for buyer, lines, coupon, pick in first:
            self.place_shop(buyer=buyer, lines=lines, coupon=coupon, pick=pick)

    @rule(buyer=BUYER, lines=LINES, coupon=COUPON, pick=PICK)
    def place_shop(self, buyer: int, lines: list[tuple[int, int]], coupon: str, pick: int) -> None:
        buyer_id = self.users[buyer]
        wanted: dict[int, int] = {}
        for sku, quantity in lines:
            wanted[self.sku_ids[sku]] = wanted.get(self.sku_ids[sku], 0) + quantity
        coupon_id = self.pick_coupon(buyer_id, coupon, pick)
        expected = self.model.shop_refusal(buyer_id, wanted, coupon_id)
        event(f"shop order: {expected.__name__ if expected else 'placed'}")
        view = self.attempt(
            shop.place_shop_order(
                self.deps,
                buyer_id=buyer_id,
                lines=[{"sku_id": self.sku_ids[s], "quantity": q} for s, q in lines],
                coupon_id=coupon_id,
            ),
            expected,
        )
        if view is not None:
            o = self.model.place_shop(view["id"], buyer_id, wanted, coupon_id)
            assert (view["amount"], view["order_type"]) == (o.amount, "shop")

    def pick_coupon(self, buyer_id: int, which: str, pick: int) -> int | None:
        if which == "none":
            return None
        if which == "missing":
            return MISSING
        mine = [c for c in sorted(self.model.coupons) if self.model.coupons[c].owner == buyer_id]
        others = [c for c in sorted(self.model.coupons) if c not in mine]
        found = mine if which == "mine" else others
        return found[pick % len(found)] if found else None

    @rule(
        buyer=BUYER,
        sale=st.sampled_from([0, 0, 0, 1, 1, 2]),
        quantity=st.sampled_from([1, 1, 2, 3]),
    )
    def place_flash(self, buyer: int, sale: int, quantity: int) -> None:
        buyer_id, sale_id = self.users[buyer], self.sale_ids[sale]
        expected = self.model.flash_refusal(buyer_id, sale_id, quantity)
        event(f"flash order: {expected.__name__ if expected else 'placed'}")
        view = self.attempt(
            shop.place_flash_order(
                self.deps, buyer_id=buyer_id, flash_sale_id=sale_id, quantity=quantity
            ),
            expected,
        )
        if view is not None:
            o = self.model.place_flash(view["id"], buyer_id, sale_id, quantity)
            assert (view["amount"], view["order_type"]) == (o.amount, "flash")

    @rule(buyer=st.integers(0, BUYERS - 1))
    def rush_the_flash_sale(self, buyer: int) -> None:
        """A buyer takes one unit of the mug's flash sale (the sales' rush: most often this)."""
        self.place_flash(buyer=buyer, sale=0, quantity=1)

    @precondition(lambda self: self.model.orders)
    @rule(pick=PICK, fitting=FITTING, exact=st.sampled_from([True] * 5 + [False]))
    def pay(self, pick: int, fitting: bool, exact: bool) -> None:
        """Money arrives: in time, after the deadline (before or after the cancel), a second
        time, or for another amount (refused, nothing recorded)."""
        o = self.order(pick, fitting, "pending_payment")
        amount = o.amount if exact else o.amount + Decimal("0.01")
        result = self.attempt(
            payments.record_manual_payment(self.deps, order_id=o.id, amount=amount),
            None if exact else PaymentMismatch,
        )
        if result is not None:
            outcome = self.model.pay(o)
            event(f"pay: {outcome}")
            assert result[1].value == outcome

    @precondition(lambda self: self.model.orders)
    @rule(pick=PICK)
    def next_step(self, pick: int) -> None:
        """Someone takes an order one step along its happy path (short examples still reach
        every stage)."""
        o = self.order(pick, True, "pending_payment", "pending_shipment", "shipped")
        if o.status == "pending_payment":
            self.pay(pick=pick, fitting=True, exact=True)
        elif o.status == "pending_shipment":
            self.ship(pick=pick, fitting=True, other=None)
        elif o.status == "shipped":
            self.confirm_receipt(pick=pick, fitting=True, other=None)

    @rule(sku=st.integers(0, len(SKUS) - 1), quantity=st.sampled_from([1, 2, 3, 0]), other=OTHER)
    def restock(self, sku: int, quantity: int, other: int | None) -> None:
        item = self.model.skus[self.sku_ids[sku]]
        user_id = self.party(item.seller, other)
        expected = InvalidInput if quantity == 0 else NotAllowed if user_id != item.seller else None
        view = self.attempt(
            shop.restock(self.deps, sku_id=item.id, user_id=user_id, quantity=quantity), expected
        )
        if view is not None:
            self.model.restock(item.id, quantity)
            assert (view["stock"], view["held"], view["sold"], view["stocked"]) == item.counts()

    @rule(template=st.integers(0, len(TEMPLATES) - 1), user=st.integers(0, BUYERS), other=OTHER)
    def issue(self, template: int, user: int, other: int | None) -> None:
        """The template's seller (or someone else) issues one more coupon to a user."""
        tpl = self.model.templates[self.template_ids[template]]
        issuer = self.party(tpl.seller, other)
        if issuer != tpl.seller:
            expected: type[Exception] | None = NotAllowed
        elif tpl.valid_until <= self.model.now or tpl.issued >= tpl.total:
            expected = CouponUnusable
        else:
            expected = None
        view = self.attempt(
            shop.issue_coupon(
                self.deps, template_id=tpl.id, issuer_id=issuer, user_id=self.users[user]
            ),
            expected,
        )
        if view is not None:
            tpl.issued += 1
            c = m.MCoupon(view["id"], tpl, self.users[user])
            assert c.id not in self.model.coupons and view["state"] == c.state_at(self.model.now)
            self.model.coupons[c.id] = c

    # -- after every step

    @invariant()
    def database_is_the_model(self) -> None:
        rows = shop_rows.read(self.engine)
        assert shop_rows.db_snapshot(rows) == self.model.snapshot()
        assert sent(self.notifier) == self.model.sent
        shop_rows.structural_invariants(rows, drained=False)

    @invariant()
    def drained_it_keeps_every_promise(self) -> None:
        """Once a worker has drained (on a copy, whenever something is due): no order past its
        deadline, every cancelled order told once, with its reason, and the model's drained
        state."""
        drained = self.drained_copy()
        if drained is None:
            return
        rows = shop_rows.read(self.shadow_engine)
        shop_rows.structural_invariants(rows, drained=True)
        assert shop_rows.db_snapshot(rows) == drained.snapshot()
        told = sent(self.notifier) + sent(self.shadow_notifier)
        assert told == drained.sent
        cancelled = [o for o in drained.orders.values() if o.status in m.CANCELLED]
        for o in cancelled:
            assert told[(o.id, "order_closed", o.cancel_reason)] == 1, o.id
        assert sum(n for (_, kind, _), n in told.items() if kind == "order_closed") == len(
            cancelled
        )


@pytest.mark.slow
def test_random_shop_life_keeps_every_promise(migrated_template: Path, tmp_path: Path) -> None:
    model_harness.check(
        ShopLife, migrated_template, tmp_path, **model_harness.from_env(examples=25, steps=40)
    )
