"""The payment tables: payment attempts, refunds, discrepancies, the providers' notification
inbox."""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)

from dueflow.store._schema_base import table_with_id, timestamps
from dueflow.store.types import Id, Money, UTCDateTime

payments = table_with_id(
    "payments",
    Column("pay_no", String(32), nullable=False, unique=True),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    Column("provider", String(16), nullable=False),
    Column("amount", Money, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    # open | paid | closed
    Column("state", String(16), nullable=False),
    Column("provider_trade_no", String(64)),
    Column("created_at", UTCDateTime, nullable=False),
    Column("handled_at", UTCDateTime),
    # What became of the start request: created | refused; NULL while (or if ever) unknown.
    Column("start_answer", String(16)),
    # What the provider gave back of this attempt on its own, not through a refund of ours
    # (Alipay's trade.cancel refunds a trade paid meanwhile); NULL: nothing known.
    Column("provider_refunded", Money),
)

refunds = table_with_id(
    "refunds",
    Column("refund_no", String(40), nullable=False, unique=True),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    # One refund per paid attempt: normally one per order, two only if two attempts were paid.
    Column("payment_id", Id, ForeignKey("payments.id"), nullable=False, unique=True),
    Column("provider", String(16), nullable=False),
    Column("amount", Money, nullable=False),
    Column("reason", String(32), nullable=False),
    # pending_review | processing | succeeded | failed | rejected | settled_offline |
    # already_refunded (the provider had given the money back by itself: none went out here)
    Column("state", String(16), nullable=False),
    Column("last_error", Text),
    *timestamps(),
    # The refunds list (store/lists.py) in one state, newest first; it serves every other
    # read by state too.
    Index("ix_refunds_state_id", "state", "id"),
)

discrepancies = table_with_id(
    "discrepancies",
    Column("kind", String(32), nullable=False),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    Column("payment_id", Id, ForeignKey("payments.id"), nullable=False),
    Column("detail", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("payment_id", "kind"),
)

notifications = table_with_id(
    "notifications",
    Column("provider", String(16), nullable=False),
    Column("received_at", UTCDateTime, nullable=False),
    Column("headers", Text, nullable=False),  # JSON object of the request headers
    Column("body", LargeBinary(2**20), nullable=False),  # raw, at most the size limit
    Column("body_truncated", Boolean, nullable=False),
    Column("verified", Boolean, nullable=False),
    # received | confirmed | duplicate | refund | refund_updated | provider_refund | recorded |
    # rejected | error
    Column("outcome", String(32), nullable=False),
    Column("error", Text),
    Column("pay_no", String(32), index=True),
    Column("event", String(16)),
)
