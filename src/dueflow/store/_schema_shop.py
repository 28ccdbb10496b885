"""The shop tables: SKUs, coupon templates and coupons, flash sales and their per-buyer counts."""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Column, ForeignKey, Index, Integer, String, Table
from sqlalchemy.schema import SchemaItem

from dueflow.store._schema_base import metadata, table_with_id, timestamps
from dueflow.store.types import Id, Money, UTCDateTime


def _units() -> tuple[SchemaItem, ...]:
    """The units of a SKU or a flash sale, counted where they are: ``stock`` (on sale), ``held``
    (by live unpaid orders), ``sold`` (with paid orders, refunded or not: an operator restocks
    what comes back); ``stocked`` is every unit ever put in. Stock is taken by one guarded
    update (``stock >= :q``); the checks are the last line."""
    return (
        Column("stock", Integer, nullable=False),
        Column("held", Integer, nullable=False),
        Column("sold", Integer, nullable=False),
        Column("stocked", Integer, nullable=False),
        CheckConstraint("stock >= 0 AND held >= 0 AND sold >= 0", name="counts_not_negative"),
        CheckConstraint("stock + held + sold = stocked", name="units_balance"),
    )


#: A shop's stock keeping unit: a seller's item at one price, sold from its units (:func:`_units`).
skus = table_with_id(
    "skus",
    Column("seller_id", Id, ForeignKey("users.id"), nullable=False),
    Column("title", String(200), nullable=False),
    Column("price", Money, nullable=False),
    *_units(),
    *timestamps(),
    Index("ix_skus_seller_id_id", "seller_id", "id"),
)

#: What a seller's coupons are worth: an amount off orders of at least ``min_amount`` from the
#: seller, valid in [valid_from, valid_until), at most ``total`` issued.
coupon_templates = table_with_id(
    "coupon_templates",
    Column("seller_id", Id, ForeignKey("users.id"), nullable=False),
    Column("title", String(200), nullable=False),
    Column("amount_off", Money, nullable=False),
    Column("min_amount", Money, nullable=False),
    Column("valid_from", UTCDateTime, nullable=False),
    Column("valid_until", UTCDateTime, nullable=False),
    Column("total", Integer, nullable=False),
    Column("issued", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    CheckConstraint("issued >= 0 AND issued <= total", name="issued_within_total"),
    # The templates list (store/lists.py): a seller's, newest first, one range read.
    Index("ix_coupon_templates_seller_id_id", "seller_id", "id"),
)

#: A coupon issued to a user: available -> locked (by one unpaid order) -> used (paid); a cancel
#: before payment gives it back (available, or expired once its validity ended).
coupons = table_with_id(
    "coupons",
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
flash_sales = table_with_id(
    "flash_sales",
    Column("sku_id", Id, ForeignKey("skus.id"), nullable=False),
    Column("seller_id", Id, ForeignKey("users.id"), nullable=False),
    Column("price", Money, nullable=False),
    *_units(),
    Column("starts_at", UTCDateTime, nullable=False),
    Column("ends_at", UTCDateTime, nullable=False),
    Column("per_buyer_limit", Integer, nullable=False),
    *timestamps(),
    # The flash sales list (store/lists.py): a SKU's or a seller's, newest first.
    Index("ix_flash_sales_sku_id_id", "sku_id", "id"),
    Index("ix_flash_sales_seller_id_id", "seller_id", "id"),
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
