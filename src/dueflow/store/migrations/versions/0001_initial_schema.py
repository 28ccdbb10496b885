"""initial schema"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dueflow.store.types import Id, Money, UTCDateTime

LIVE_TIMERS = "state IN ('scheduled', 'claimed')"

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", name=op.f("uq_users_name")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_users_token_hash")),
    )
    op.create_table(
        "goods",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("seller_id", Id, nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("price", Money(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reserved_order_id", Id, nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["seller_id"], ["users.id"], name=op.f("fk_goods_seller_id_users")),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("goods", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_goods_reserved_order_id"), ["reserved_order_id"], unique=False
        )

    op.create_table(
        "orders",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("profile", sa.String(length=32), nullable=False),
        sa.Column("order_type", sa.String(length=32), nullable=False),
        sa.Column("buyer_id", Id, nullable=False),
        sa.Column("seller_id", Id, nullable=False),
        sa.Column("goods_id", Id, nullable=False),
        sa.Column("amount", Money(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("pay_deadline", UTCDateTime(), nullable=False),
        sa.Column("paid_at", UTCDateTime(), nullable=True),
        sa.Column("ship_deadline", UTCDateTime(), nullable=True),
        sa.Column("shipped_at", UTCDateTime(), nullable=True),
        sa.Column("carrier", sa.String(length=64), nullable=True),
        sa.Column("tracking_no", sa.String(length=64), nullable=True),
        sa.Column("receive_deadline", UTCDateTime(), nullable=True),
        sa.Column("received_at", UTCDateTime(), nullable=True),
        sa.Column("review_deadline", UTCDateTime(), nullable=True),
        sa.Column("completed_at", UTCDateTime(), nullable=True),
        sa.Column("cancelled_at", UTCDateTime(), nullable=True),
        sa.Column("cancel_reason", sa.String(length=32), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["buyer_id"], ["users.id"], name=op.f("fk_orders_buyer_id_users")),
        sa.ForeignKeyConstraint(["goods_id"], ["goods.id"], name=op.f("fk_orders_goods_id_goods")),
        sa.ForeignKeyConstraint(
            ["seller_id"], ["users.id"], name=op.f("fk_orders_seller_id_users")
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("orders", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_orders_buyer_id"), ["buyer_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_orders_goods_id"), ["goods_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_orders_seller_id"), ["seller_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_orders_status"), ["status"], unique=False)

    op.create_table(
        "order_events",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("order_id", Id, nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("from_status", sa.String(length=32), nullable=True),
        sa.Column("to_status", sa.String(length=32), nullable=True),
        sa.Column("detail", sa.String(length=500), nullable=True),
        sa.ForeignKeyConstraint(
            ["order_id"], ["orders.id"], name=op.f("fk_order_events_order_id_orders")
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("order_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_order_events_order_id"), ["order_id"], unique=False)

    op.create_table(
        "payments",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("pay_no", sa.String(length=32), nullable=False),
        sa.Column("order_id", Id, nullable=False),
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("amount", Money(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("provider_trade_no", sa.String(length=64), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("handled_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["order_id"], ["orders.id"], name=op.f("fk_payments_order_id_orders")
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("pay_no", name=op.f("uq_payments_pay_no")),
    )
    with op.batch_alter_table("payments", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_payments_order_id"), ["order_id"], unique=False)

    op.create_table(
        "reminders",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("order_id", Id, nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["order_id"], ["orders.id"], name=op.f("fk_reminders_order_id_orders")
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("order_id", "kind", name=op.f("uq_reminders_order_id_kind")),
    )
    op.create_table(
        "reviews",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("order_id", Id, nullable=False),
        sa.Column("role", sa.String(length=8), nullable=False),
        sa.Column("author_id", Id, nullable=False),
        sa.Column("rating", sa.Integer(), nullable=False),
        sa.Column("comment", sa.String(length=500), nullable=False),
        sa.Column("is_default", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["author_id"], ["users.id"], name=op.f("fk_reviews_author_id_users")
        ),
        sa.ForeignKeyConstraint(
            ["order_id"], ["orders.id"], name=op.f("fk_reviews_order_id_orders")
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("order_id", "role", name=op.f("uq_reviews_order_id_role")),
    )
    op.create_table(
        "timers",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("order_id", Id, nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("deadline_at", UTCDateTime(), nullable=False),
        sa.Column("due_at", UTCDateTime(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_until", UTCDateTime(), nullable=True),
        sa.Column("claim_token", sa.String(length=32), nullable=True),
        sa.Column("stuck", sa.Boolean(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("outcome", sa.String(length=200), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("done_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["order_id"], ["orders.id"], name=op.f("fk_timers_order_id_orders")
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("order_id", "kind", name=op.f("uq_timers_order_id_kind")),
    )
    with op.batch_alter_table("timers", schema=None) as batch_op:
        batch_op.create_index(
            "ix_timers_live",
            ["state", "due_at", "id"],
            unique=False,
            postgresql_where=sa.text(LIVE_TIMERS),
        )

    op.create_table(
        "discrepancies",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("order_id", Id, nullable=False),
        sa.Column("payment_id", Id, nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["order_id"], ["orders.id"], name=op.f("fk_discrepancies_order_id_orders")
        ),
        sa.ForeignKeyConstraint(
            ["payment_id"], ["payments.id"], name=op.f("fk_discrepancies_payment_id_payments")
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("payment_id", "kind", name=op.f("uq_discrepancies_payment_id_kind")),
    )
    with op.batch_alter_table("discrepancies", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_discrepancies_order_id"), ["order_id"], unique=False)

    op.create_table(
        "refunds",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("refund_no", sa.String(length=40), nullable=False),
        sa.Column("order_id", Id, nullable=False),
        sa.Column("payment_id", Id, nullable=False),
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("amount", Money(), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["order_id"], ["orders.id"], name=op.f("fk_refunds_order_id_orders")
        ),
        sa.ForeignKeyConstraint(
            ["payment_id"], ["payments.id"], name=op.f("fk_refunds_payment_id_payments")
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("payment_id", name=op.f("uq_refunds_payment_id")),
        sa.UniqueConstraint("refund_no", name=op.f("uq_refunds_refund_no")),
    )
    with op.batch_alter_table("refunds", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_refunds_order_id"), ["order_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_refunds_state"), ["state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("refunds", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_refunds_state"))
        batch_op.drop_index(batch_op.f("ix_refunds_order_id"))

    op.drop_table("refunds")
    with op.batch_alter_table("discrepancies", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_discrepancies_order_id"))

    op.drop_table("discrepancies")
    with op.batch_alter_table("timers", schema=None) as batch_op:
        batch_op.drop_index("ix_timers_live")

    op.drop_table("timers")
    op.drop_table("reviews")
    op.drop_table("reminders")
    with op.batch_alter_table("payments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_payments_order_id"))

    op.drop_table("payments")
    with op.batch_alter_table("order_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_order_events_order_id"))

    op.drop_table("order_events")
    with op.batch_alter_table("orders", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_orders_status"))
        batch_op.drop_index(batch_op.f("ix_orders_seller_id"))
        batch_op.drop_index(batch_op.f("ix_orders_goods_id"))
        batch_op.drop_index(batch_op.f("ix_orders_buyer_id"))

    op.drop_table("orders")
    with op.batch_alter_table("goods", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_goods_reserved_order_id"))

    op.drop_table("goods")
    op.drop_table("users")
