"""shop: SKUs, coupon templates and coupons, flash sales and their per-buyer counts, and the
Idempotency-Keys of placed orders"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dueflow.store.types import Id, Money, UTCDateTime

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    op.create_table(
        "coupon_templates",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("seller_id", Id, nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("amount_off", Money(), nullable=False),
        sa.Column("min_amount", Money(), nullable=False),
        sa.Column("valid_from", UTCDateTime(), nullable=False),
        sa.Column("valid_until", UTCDateTime(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("issued", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "issued >= 0 AND issued <= total", name=op.f("ck_coupon_templates_issued_within_total")
        ),
        sa.ForeignKeyConstraint(
            ["seller_id"], ["users.id"], name=op.f("fk_coupon_templates_seller_id_users")
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("coupon_templates", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_coupon_templates_seller_id"), ["seller_id"], unique=False
        )

    op.create_table(
        "skus",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("seller_id", Id, nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("price", Money(), nullable=False),
        sa.Column("stock", sa.Integer(), nullable=False),
        sa.Column("held", sa.Integer(), nullable=False),
        sa.Column("sold", sa.Integer(), nullable=False),
        sa.Column("stocked", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint("stock + held + sold = stocked", name=op.f("ck_skus_units_balance")),
        sa.CheckConstraint(
            "stock >= 0 AND held >= 0 AND sold >= 0", name=op.f("ck_skus_counts_not_negative")
        ),
        sa.ForeignKeyConstraint(["seller_id"], ["users.id"], name=op.f("fk_skus_seller_id_users")),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("skus", schema=None) as batch_op:
        batch_op.create_index("ix_skus_seller_id_id", ["seller_id", "id"], unique=False)

    op.create_table(
        "flash_sales",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("sku_id", Id, nullable=False),
        sa.Column("seller_id", Id, nullable=False),
        sa.Column("price", Money(), nullable=False),
        sa.Column("stock", sa.Integer(), nullable=False),
        sa.Column("held", sa.Integer(), nullable=False),
        sa.Column("sold", sa.Integer(), nullable=False),
        sa.Column("stocked", sa.Integer(), nullable=False),
        sa.Column("starts_at", UTCDateTime(), nullable=False),
        sa.Column("ends_at", UTCDateTime(), nullable=False),
        sa.Column("per_buyer_limit", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "stock + held + sold = stocked", name=op.f("ck_flash_sales_units_balance")
        ),
        sa.CheckConstraint(
            "stock >= 0 AND held >= 0 AND sold >= 0",
            name=op.f("ck_flash_sales_counts_not_negative"),
        ),
        sa.ForeignKeyConstraint(
            ["seller_id"], ["users.id"], name=op.f("fk_flash_sales_seller_id_users")
        ),
        sa.ForeignKeyConstraint(["sku_id"], ["skus.id"], name=op.f("fk_flash_sales_sku_id_skus")),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("flash_sales", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_flash_sales_sku_id"), ["sku_id"], unique=False)

    op.create_table(
        "coupons",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("template_id", Id, nullable=False),
        sa.Column("user_id", Id, nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("order_id", Id, nullable=True),
        sa.Column("valid_until", UTCDateTime(), nullable=False),
        sa.Column("issued_at", UTCDateTime(), nullable=False),
        sa.Column("used_at", UTCDateTime(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "(state IN ('locked', 'used')) = (order_id IS NOT NULL)",
            name=op.f("ck_coupons_order_when_taken"),
        ),
        sa.ForeignKeyConstraint(
            ["order_id"], ["orders.id"], name=op.f("fk_coupons_order_id_orders")
        ),
        sa.ForeignKeyConstraint(
            ["template_id"],
            ["coupon_templates.id"],
            name=op.f("fk_coupons_template_id_coupon_templates"),
        ),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_coupons_user_id_users")),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("coupons", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_coupons_order_id"), ["order_id"], unique=False)
        batch_op.create_index("ix_coupons_user_id_id", ["user_id", "id"], unique=False)

    op.create_table(
        "flash_buyers",
        sa.Column("flash_sale_id", Id, autoincrement=False, nullable=False),
        sa.Column("buyer_id", Id, autoincrement=False, nullable=False),
        sa.Column("units", sa.Integer(), nullable=False),
        sa.CheckConstraint("units >= 0", name=op.f("ck_flash_buyers_units_not_negative")),
        sa.ForeignKeyConstraint(
            ["buyer_id"], ["users.id"], name=op.f("fk_flash_buyers_buyer_id_users")
        ),
        sa.ForeignKeyConstraint(
            ["flash_sale_id"],
            ["flash_sales.id"],
            name=op.f("fk_flash_buyers_flash_sale_id_flash_sales"),
        ),
        sa.PrimaryKeyConstraint("flash_sale_id", "buyer_id"),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("buyer_id", Id, nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("order_id", Id, nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("body", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["buyer_id"], ["users.id"], name=op.f("fk_idempotency_keys_buyer_id_users")
        ),
        sa.ForeignKeyConstraint(
            ["order_id"], ["orders.id"], name=op.f("fk_idempotency_keys_order_id_orders")
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("buyer_id", "key", name=op.f("uq_idempotency_keys_buyer_id_key")),
    )
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.create_index("ix_idempotency_keys_created_at", ["created_at"], unique=False)

    op.create_index("ix_order_lines_kind_item_id", "order_lines", ["kind", "item_id"])
    _notices_for_earlier_cancels()


#: Cancelled orders and the timers table, as this revision knows them.
_orders = sa.table(
    "orders",
    sa.column("id"),
    sa.column("status"),
    sa.column("cancelled_at"),
    sa.column("updated_at"),
)
_timers = sa.table(
    "timers",
    sa.column("order_id"),
    sa.column("kind"),
    sa.column("deadline_at"),
    sa.column("due_at"),
    sa.column("state"),
    sa.column("attempts"),
    sa.column("stuck"),
    sa.column("outcome"),
    sa.column("created_at"),
    sa.column("done_at"),
)
_CANCELLED = ("cancelled_unpaid", "cancelled_unshipped", "cancelled_paid")


def _notices_for_earlier_cancels() -> None:
    """From this revision every cancel writes an ``order_closed`` notice timer. Orders cancelled
    before it get one already done, saying no notice went out, so every cancelled order has
    exactly one and the invariant holds for old data too."""
    when = sa.func.coalesce(_orders.c.cancelled_at, _orders.c.updated_at)
    told = (
        sa.select(_timers.c.order_id)
        .where(_timers.c.order_id == _orders.c.id, _timers.c.kind == "order_closed")
        .exists()
    )
    earlier = sa.select(
        _orders.c.id,
        sa.literal("order_closed"),
        when,
        when,
        sa.literal("done"),
        sa.literal(0),
        sa.false(),
        sa.literal("not sent: cancelled before dueflow sent order_closed notices"),
        when,
        when,
    ).where(_orders.c.status.in_(_CANCELLED), ~told)
    op.execute(
        _timers.insert().from_select(
            [
                "order_id",
                "kind",
                "deadline_at",
                "due_at",
                "state",
                "attempts",
                "stuck",
                "outcome",
                "created_at",
                "done_at",
            ],
            earlier,
        )
    )


def downgrade() -> None:
    op.drop_index("ix_order_lines_kind_item_id", table_name="order_lines")
    # 0009 knows no order_closed timer kind: none may be left waiting for it.
    op.execute(
        _timers.delete().where(
            _timers.c.kind == "order_closed", _timers.c.state.in_(("scheduled", "claimed"))
        )
    )
    # Dropping a table drops its indexes; dropping them first fails on MariaDB, where each
    # foreign key needs its index for as long as the table exists.
    for table in (
        "idempotency_keys",
        "flash_buyers",
        "coupons",
        "flash_sales",
        "skus",
        "coupon_templates",
    ):
        op.drop_table(table)
