"""The tables (SQLAlchemy Core). Alembic migrations in ``migrations/`` create exactly these."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from dueflow.store.types import Money, UTCDateTime

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
    }
)

LIVE_TIMERS = "state IN ('scheduled', 'claimed')"
PARKED_TIMERS = "state = 'parked'"

# SQLite needs INTEGER PRIMARY KEY for rowid aliasing; elsewhere ids are 64-bit.
Id = BigInteger().with_variant(Integer(), "sqlite")

users = Table(
    "users",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("is_admin", Boolean, nullable=False, default=False),
    Column("created_at", UTCDateTime, nullable=False),
)

goods = Table(
    "goods",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("seller_id", Id, ForeignKey("users.id"), nullable=False),
    Column("title", String(200), nullable=False),
    Column("price", Money, nullable=False),
    # on_sale | sold | off_sale. Held = on_sale with reserved_order_id set.
    Column("status", String(16), nullable=False),
    Column("reserved_order_id", Id, nullable=True, index=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # The goods lists (newest first, keyset on id): what is on sale, a seller's goods on sale,
    # and a seller's own goods in every status. Each page is one range read of one of these.
    Index("ix_goods_status_id", "status", "id"),
    Index("ix_goods_seller_id_status_id", "seller_id", "status", "id"),
    Index("ix_goods_seller_id_id", "seller_id", "id"),
)

orders = Table(
    "orders",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    # The order's life (domain.lifecycle.LIFECYCLES), chosen by what it holds.
    Column("flow", String(32), nullable=False),
    Column("order_type", String(32), nullable=False),
    Column("buyer_id", Id, ForeignKey("users.id"), nullable=False, index=True),
    # The goods' seller, the show's organizer.
    Column("seller_id", Id, ForeignKey("users.id"), nullable=False, index=True),
    # What the order holds is in order_lines; these say which goods or show, for lookups.
    Column("goods_id", Id, ForeignKey("goods.id"), nullable=True, index=True),
    Column("show_id", Id, ForeignKey("shows.id"), nullable=True, index=True),
    Column("amount", Money, nullable=False),
    Column("status", String(32), nullable=False, index=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("pay_deadline", UTCDateTime, nullable=False),
    Column("paid_at", UTCDateTime),
    Column("ship_deadline", UTCDateTime),
    Column("shipped_at", UTCDateTime),
    Column("carrier", String(64)),
    Column("tracking_no", String(64)),
    Column("receive_deadline", UTCDateTime),
    Column("received_at", UTCDateTime),
    Column("review_deadline", UTCDateTime),
    Column("completed_at", UTCDateTime),
    Column("cancelled_at", UTCDateTime),
    Column("cancel_reason", String(32)),
    Column("updated_at", UTCDateTime, nullable=False),
    # A party's orders, newest first (keyset on id), in every status or in one: each page of
    # GET /api/orders is one range read. (PostgreSQL keeps no id order in the one-column
    # buyer_id and seller_id indexes, so those alone would sort every order of the party.)
    Index("ix_orders_buyer_id_id", "buyer_id", "id"),
    Index("ix_orders_buyer_id_status_id", "buyer_id", "status", "id"),
    Index("ix_orders_seller_id_id", "seller_id", "id"),
    Index("ix_orders_seller_id_status_id", "seller_id", "status", "id"),
)

#: What each order holds, one row per thing held, kept for good (what was bought): goods, seats
#: SKU units, flash-sale units, a coupon. The live holds themselves are where each kind keeps
#: them (goods.reserved_order_id, seat_holds, the counts of skus and flash_sales, coupons).
order_lines = Table(
    "order_lines",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    Column("kind", String(16), nullable=False),  # goods | seat | sku | flash | coupon
    Column("item_id", Id, nullable=False),  # the goods, seat, SKU, flash sale or coupon id
    Column("label", String(200), nullable=False),  # what the buyer saw: a title, a seat label
    Column("quantity", Integer, nullable=False),
    Column("price", Money, nullable=False),  # each
    # What holds a SKU, a flash sale or a coupon (the admin pages and the invariants).
    Index("ix_order_lines_kind_item_id", "kind", "item_id"),
)

shows = Table(
    "shows",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("organizer_id", Id, ForeignKey("users.id"), nullable=False),
    Column("title", String(200), nullable=False),
    Column("venue", String(200), nullable=False),
    Column("starts_at", UTCDateTime, nullable=False),
    Column("sales_close_at", UTCDateTime, nullable=False),
    Column("seat_limit", Integer, nullable=False),  # seats one buyer may hold or buy
    Column("status", String(16), nullable=False),  # on_sale | cancelled
    Column("cancelled_at", UTCDateTime),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Index("ix_shows_organizer_id_id", "organizer_id", "id"),
)

seats = Table(
    "seats",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("show_id", Id, ForeignKey("shows.id"), nullable=False),
    Column("label", String(16), nullable=False),
    Column("section", String(8), nullable=False),
    Column("row", String(8)),
    Column("number", Integer, nullable=False),
    Column("tier", String(16), nullable=False),  # the price tier (the section by default)
    Column("price", Money, nullable=False),
    UniqueConstraint("show_id", "label"),
)

#: Live seat holds and sales: a row per seat held by a live unpaid order or sold to a paid one,
#: deleted when the order lets the seat go. The unique key is the promise that no seat is held
#: or sold twice, whatever any cache says.
seat_holds = Table(
    "seat_holds",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("show_id", Id, ForeignKey("shows.id"), nullable=False),
    Column("seat_id", Id, ForeignKey("seats.id"), nullable=False),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    Column("buyer_id", Id, ForeignKey("users.id"), nullable=False),
    Column("state", String(8), nullable=False),  # held | sold
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    UniqueConstraint("show_id", "seat_id"),
)

#: Seats each buyer holds or bought for a show: the per-buyer limit is one guarded update of
#: this row inside the placing transaction, so two parallel orders cannot both pass it.
show_buyers = Table(
    "show_buyers",
    metadata,
    Column("show_id", Id, ForeignKey("shows.id"), primary_key=True, autoincrement=False),
    Column("buyer_id", Id, ForeignKey("users.id"), primary_key=True, autoincrement=False),
    Column("seats", Integer, nullable=False),
    CheckConstraint("seats >= 0", name="seats_not_negative"),
)

#: One ticket per seat of a paid order, its code unguessable; void once the show is cancelled.
tickets = Table(
    "tickets",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("code", String(32), nullable=False, unique=True),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    Column("show_id", Id, ForeignKey("shows.id"), nullable=False),
    Column("seat_id", Id, ForeignKey("seats.id"), nullable=False),
    Column("state", String(8), nullable=False),  # valid | void
    Column("created_at", UTCDateTime, nullable=False),
    Column("voided_at", UTCDateTime),
)

#: A shop's stock keeping unit. Its units are counted where they are: ``stock`` (on sale),
#: ``held`` (by live unpaid orders), ``sold`` (with paid orders, refunded or not: an operator
#: restocks what comes back); ``stocked`` is every unit ever put in. Stock is taken by one
#: guarded update (``stock >= :q``); the checks are the last line.
skus = Table(
    "skus",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("seller_id", Id, ForeignKey("users.id"), nullable=False),
    Column("title", String(200), nullable=False),
    Column("price", Money, nullable=False),
    Column("stock", Integer, nullable=False),
    Column("held", Integer, nullable=False),
    Column("sold", Integer, nullable=False),
    Column("stocked", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    CheckConstraint("stock >= 0 AND held >= 0 AND sold >= 0", name="counts_not_negative"),
    CheckConstraint("stock + held + sold = stocked", name="units_balance"),
    Index("ix_skus_seller_id_id", "seller_id", "id"),
)

#: What a seller's coupons are worth: an amount off orders of at least ``min_amount`` from the
#: seller, valid in [valid_from, valid_until), at most ``total`` issued.
coupon_templates = Table(
    "coupon_templates",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("seller_id", Id, ForeignKey("users.id"), nullable=False, index=True),
    Column("title", String(200), nullable=False),
    Column("amount_off", Money, nullable=False),
    Column("min_amount", Money, nullable=False),
    Column("valid_from", UTCDateTime, nullable=False),
    Column("valid_until", UTCDateTime, nullable=False),
    Column("total", Integer, nullable=False),
    Column("issued", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    CheckConstraint("issued >= 0 AND issued <= total", name="issued_within_total"),
)

#: A coupon issued to a user: available -> locked (by one unpaid order) -> used (paid); a cancel
#: before payment gives it back (available, or expired once its validity ended).
coupons = Table(
    "coupons",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("template_id", Id, ForeignKey("coupon_templates.id"), nullable=False),
    Column("user_id", Id, ForeignKey("users.id"), nullable=False),
    Column("state", String(16), nullable=False),  # available | locked | used | expired
    Column("order_id", Id, ForeignKey("orders.id"), nullable=True, index=True),
    Column("valid_until", UTCDateTime, nullable=False),
    Column("issued_at", UTCDateTime, nullable=False),
    Column("used_at", UTCDateTime),
    Column("updated_at", UTCDateTime, nullable=False),
    CheckConstraint(
        "(state IN ('locked', 'used')) = (order_id IS NOT NULL)", name="order_when_taken"
    ),
    Index("ix_coupons_user_id_id", "user_id", "id"),
)

#: A flash sale of one SKU: its own price, its own units (counted like a SKU's), a window and
#: a per-buyer limit. A flash order holds units of the sale and of the SKU.
flash_sales = Table(
    "flash_sales",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("sku_id", Id, ForeignKey("skus.id"), nullable=False, index=True),
    Column("seller_id", Id, ForeignKey("users.id"), nullable=False),
    Column("price", Money, nullable=False),
    Column("stock", Integer, nullable=False),
    Column("held", Integer, nullable=False),
    Column("sold", Integer, nullable=False),
    Column("stocked", Integer, nullable=False),
    Column("starts_at", UTCDateTime, nullable=False),
    Column("ends_at", UTCDateTime, nullable=False),
    Column("per_buyer_limit", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    CheckConstraint("stock >= 0 AND held >= 0 AND sold >= 0", name="counts_not_negative"),
    CheckConstraint("stock + held + sold = stocked", name="units_balance"),
)

#: Units each buyer holds or bought of a flash sale: the per-buyer limit is one guarded update.
flash_buyers = Table(
    "flash_buyers",
    metadata,
    Column(
        "flash_sale_id", Id, ForeignKey("flash_sales.id"), primary_key=True, autoincrement=False
    ),
    Column("buyer_id", Id, ForeignKey("users.id"), primary_key=True, autoincrement=False),
    Column("units", Integer, nullable=False),
    CheckConstraint("units >= 0", name="units_not_negative"),
)

#: ``Idempotency-Key`` of POST /api/orders: the first order placed under (buyer, key), the hash
#: of its request and, once answered, the answer itself. Written in the placing transaction.
idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("buyer_id", Id, ForeignKey("users.id"), nullable=False),
    Column("key", String(255), nullable=False),
    Column("request_hash", String(64), nullable=False),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False),
    Column("status_code", Integer),
    Column("body", Text),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("buyer_id", "key"),
    Index("ix_idempotency_keys_created_at", "created_at"),
)

timers = Table(
    "timers",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False),
    Column("kind", String(32), nullable=False),
    # deadline_at: the business deadline (for lateness); due_at: when to fire next (backoff moves it).
    Column("deadline_at", UTCDateTime, nullable=False),
    Column("due_at", UTCDateTime, nullable=False),
    Column("state", String(16), nullable=False),
    # attempts: every claim; failures: the handler's failures in a row (a handler's own retry,
    # such as a refund still processing, is none), which park the timer at timer_max_attempts.
    Column("attempts", Integer, nullable=False, default=0),
    Column("failures", Integer, nullable=False, default=0, server_default=text("0")),
    Column("lease_until", UTCDateTime),
    Column("claim_token", String(32)),
    Column("stuck", Boolean, nullable=False, default=False),
    Column("last_error", Text),
    Column("outcome", String(200)),
    Column("created_at", UTCDateTime, nullable=False),
    Column("done_at", UTCDateTime),
    UniqueConstraint("order_id", "kind"),
    # Due scans: an equality on state, then a range on due_at, keeps an empty scan one seek.
    # Partial (live timers only) on PostgreSQL: done timers cost the index nothing. SQLite keeps
    # the full index: its planner cannot prove state = 'scheduled' implies state IN (...).
    Index(
        "ix_timers_live",
        "state",
        "due_at",
        "id",
        postgresql_where=text(LIVE_TIMERS),
    ),
    # The dashboard's lateness over the last hour reads done timers by when they fired.
    Index("ix_timers_done_at", "done_at"),
    # The dashboard's parked timers, soonest due first: outside ix_timers_live on PostgreSQL,
    # so a partial index of their own there; elsewhere ix_timers_live serves them too.
    Index("ix_timers_parked", "state", "due_at", postgresql_where=text(PARKED_TIMERS)),
)

payments = Table(
    "payments",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
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

refunds = Table(
    "refunds",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("refund_no", String(40), nullable=False, unique=True),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    # One refund per paid attempt: normally one per order, two only if two attempts were paid.
    Column("payment_id", Id, ForeignKey("payments.id"), nullable=False, unique=True),
    Column("provider", String(16), nullable=False),
    Column("amount", Money, nullable=False),
    Column("reason", String(32), nullable=False),
    # pending_review | processing | succeeded | failed | rejected | settled_offline |
    # already_refunded (the provider had given the money back by itself: none went out here)
    Column("state", String(16), nullable=False, index=True),
    Column("last_error", Text),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

discrepancies = Table(
    "discrepancies",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("kind", String(32), nullable=False),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    Column("payment_id", Id, ForeignKey("payments.id"), nullable=False),
    Column("detail", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("payment_id", "kind"),
)

reminders = Table(
    "reminders",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False),
    Column("kind", String(32), nullable=False),
    # pending | sending (claimed by one handler until lease_until) | sent | unknown (sent, no
    # answer ever confirmed it, and no more sends: out of sends or the order moved on)
    Column("state", String(16), nullable=False),
    Column("claim_token", String(32)),
    Column("lease_until", UTCDateTime),
    Column("created_at", UTCDateTime, nullable=False),
    Column("sent_at", UTCDateTime),
    # Sends that may have reached the receiver: counted before each send, uncounted when the
    # send provably did not deliver (refused, or answered with an error).
    Column("deliveries", Integer, nullable=False, default=0, server_default=text("0")),
    UniqueConstraint("order_id", "kind"),
)

reviews = Table(
    "reviews",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False),
    Column("role", String(8), nullable=False),  # buyer | seller
    Column("author_id", Id, ForeignKey("users.id"), nullable=False),
    Column("rating", Integer, nullable=False),
    Column("comment", String(500), nullable=False),
    Column("is_default", Boolean, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("order_id", "role"),
)

order_events = Table(
    "order_events",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    Column("at", UTCDateTime, nullable=False),
    Column("event", String(32), nullable=False),
    Column("actor", String(64), nullable=False),
    Column("from_status", String(32)),
    Column("to_status", String(32)),
    Column("detail", String(500)),
    # The order in which events became visible, numbered after they commit by the sequencer
    # (store/events.py); NULL until then. Ids are not that order: a slower transaction with a
    # lower id can commit later. The unique index also finds the rows still to number.
    Column("seq", BigInteger),
    Index("ix_order_events_seq", "seq", unique=True),
    # One user's feed: the events of that user's orders, in seq order, one range per order.
    Index("ix_order_events_order_id_seq", "order_id", "seq"),
)

#: One row (id 1): the last sequence number given to an order event.
event_sequence = Table(
    "event_sequence",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("last_seq", BigInteger, nullable=False),
)

#: Where each webhook delivery stream stands: the live stream (name "live", whose lease says
#: which process delivers) and operators' replays of one event or a range.
event_deliveries = Table(
    "event_deliveries",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", String(40), nullable=False, unique=True),
    # Every event up to this seq has been delivered (a replay starts one before its first).
    Column("delivered_seq", BigInteger, nullable=False),
    Column("until_seq", BigInteger),  # a replay's last event; NULL for the live stream
    # Failed tries of the next event in a row, and the last one's error.
    Column("failures", Integer, nullable=False, default=0, server_default=text("0")),
    Column("last_error", Text),
    Column("last_error_at", UTCDateTime),
    Column("retry_at", UTCDateTime),
    Column("owner", String(64)),
    Column("lease_until", UTCDateTime),
    Column("requested_by", String(64)),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("done_at", UTCDateTime),
)

notifications = Table(
    "notifications",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
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
