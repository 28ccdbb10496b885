"""The order tables: users, goods, orders and their lines, the Idempotency-Keys, reviews."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from dueflow.store._schema_base import metadata, table_with_id, timestamps
from dueflow.store.types import ExactText, Id, Money, UTCDateTime

users = table_with_id(
    "users",
    Column("name", String(64), nullable=False, unique=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("is_admin", Boolean, nullable=False, default=False),
    Column("created_at", UTCDateTime, nullable=False),
    # A host application's own id for the user a service key acts for (Dueflow-Act-As), and
    # the name it gave; NULL for users made by `dueflow users add`.
    Column("external_id", ExactText, nullable=True, unique=True),
    Column("display_name", String(255), nullable=True),
)

goods = table_with_id(
    "goods",
    Column("seller_id", Id, ForeignKey("users.id"), nullable=False),
    Column("title", String(200), nullable=False),
    Column("price", Money, nullable=False),
    # on_sale | sold | off_sale. Held = on_sale with reserved_order_id set.
    Column("status", String(16), nullable=False),
    Column("reserved_order_id", Id, nullable=True, index=True),
    *timestamps(),
    # The goods lists (newest first, keyset on id): what is on sale, a seller's goods on sale,
    # and a seller's own goods in every status. Each page is one range read of one of these.
    Index("ix_goods_status_id", "status", "id"),
    Index("ix_goods_seller_id_status_id", "seller_id", "status", "id"),
    Index("ix_goods_seller_id_id", "seller_id", "id"),
)

orders = table_with_id(
    "orders",
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
    # The operators' list of every order (store/order_search.py), newest first: in one status,
    # and placed between two times (read in placing order), each page one range read.
    Index("ix_orders_status_id", "status", "id"),
    Index("ix_orders_created_at_id", "created_at", "id"),
    # The orders that moved last (every move sets updated_at): the dashboard's invariants
    # check the latest changes (service/invariants.py), its counts add the orders that reached
    # a final status since their watermark (store/counts.py).
    Index("ix_orders_updated_at", "updated_at"),
    # The live orders of each status by their deadline (the invariant "no order left past its
    # deadline"): partial, so only live orders cost them anything. PostgreSQL and SQLite only
    # (MySQL has no partial index: there that check walks ix_orders_status).
    *(
        Index(
            name,
            column,
            postgresql_where=text(f"status = '{status}'"),
            sqlite_where=text(f"status = '{status}'"),
        ).ddl_if(dialect=("postgresql", "sqlite"))  # type: ignore[arg-type]  # a tuple: documented
        for name, column, status in (
            ("ix_orders_pay_due", "pay_deadline", "pending_payment"),
            ("ix_orders_ship_due", "ship_deadline", "pending_shipment"),
            ("ix_orders_receive_due", "receive_deadline", "shipped"),
            ("ix_orders_review_due", "review_deadline", "received"),
        )
    ),
)

#: How many orders are in each final status (completed, cancelled: no order leaves one), counted
#: up to ``upto`` (the same in every row): the dashboard adds the orders that moved since
#: (store/counts.py) instead of counting every order on each refresh.
order_counts = Table(
    "order_counts",
    metadata,
    Column("status", String(32), primary_key=True),
    Column("orders", BigInteger, nullable=False),
    Column("upto", UTCDateTime, nullable=False),
)

#: What each order holds, one row per thing held, kept for good (what was bought): goods, seats
#: SKU units, flash-sale units, a coupon. The live holds themselves are where each kind keeps
#: them (goods.reserved_order_id, seat_holds, the counts of skus and flash_sales, coupons).
order_lines = table_with_id(
    "order_lines",
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    Column("kind", String(16), nullable=False),  # goods | seat | sku | flash | coupon
    Column("item_id", Id, nullable=False),  # the goods, seat, SKU, flash sale or coupon id
    Column("label", String(200), nullable=False),  # what the buyer saw: a title, a seat label
    Column("quantity", Integer, nullable=False),
    Column("price", Money, nullable=False),  # each
    # What holds a SKU, a flash sale or a coupon (the admin pages and the invariants).
    Index("ix_order_lines_kind_item_id", "kind", "item_id"),
)

#: ``Idempotency-Key``\ s of the POST routes that change something: one row per (principal,
#: key), the principal being who called (``user:<id>``). It names the request it came with
#: (method, route template, the hash of the body and the path parameters) and, once answered,
#: the answer. Placing writes it in the placing transaction (``order_id``: the order, whose
#: view answers a row that kept no answer); every other route claims it first, until
#: ``locked_until`` (a lease: a repeat meanwhile is told the key is in use), and keeps the answer
#: after. ``effect_id``: what a route whose effect spans a provider call made first (the payment
#: attempt), written in that effect's transaction, so a re-run after a crash resumes it.
idempotency_keys = table_with_id(
    "idempotency_keys",
    Column("principal", String(64), nullable=False),
    Column("key", String(255), nullable=False),
    Column("method", String(8), nullable=False),
    Column("route", String(200), nullable=False),
    Column("request_hash", String(64), nullable=False),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=True),
    Column("effect_id", Id, nullable=True),
    Column("status_code", Integer),
    Column("body", Text),
    Column("locked_until", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("principal", "key"),
    Index("ix_idempotency_keys_created_at", "created_at"),
)

reviews = table_with_id(
    "reviews",
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False),
    Column("role", String(8), nullable=False),  # buyer | seller
    Column("author_id", Id, ForeignKey("users.id"), nullable=False),
    Column("rating", Integer, nullable=False),
    Column("comment", String(500), nullable=False),
    Column("is_default", Boolean, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("order_id", "role"),
)
