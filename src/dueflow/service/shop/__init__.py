"""The shop: SKUs with stock, coupons, flash sales, and orders of several lines.

An order takes all its units and its coupon or nothing, in one transaction, touching rows in
id order (SKUs, then the flash sale, then the coupon); the server computes the amount (lines
minus the coupon, never below 0.01) and picks the order type: ``shop`` for SKU lines, ``flash``
for a flash sale. What an order holds goes back through the one cancel code of every flow.

The catalogue (SKUs, coupons, flash sales) is in ``_catalogue``, placing in ``_placing``, the
limits and input checks they share in ``_rules``; callers use this module's names.
"""

from __future__ import annotations

from dueflow.service.shop._catalogue import (
    coupon_json,
    coupons_of,
    create_flash_sale,
    create_sku,
    create_template,
    flash_sale_view,
    issue_coupon,
    restock,
    sku_view,
    template_view,
)
from dueflow.service.shop._placing import place_flash_order, place_shop_order, wanted_lines
from dueflow.service.shop._rules import (
    FLASH_ORDER_TYPE,
    MAX_LINES,
    MAX_QUANTITY,
    MAX_UNITS,
    SHOP_ORDER_TYPE,
)

__all__ = [
    "FLASH_ORDER_TYPE",
    "MAX_LINES",
    "MAX_QUANTITY",
    "MAX_UNITS",
    "SHOP_ORDER_TYPE",
    "coupon_json",
    "coupons_of",
    "create_flash_sale",
    "create_sku",
    "create_template",
    "flash_sale_view",
    "issue_coupon",
    "place_flash_order",
    "place_shop_order",
    "restock",
    "sku_view",
    "template_view",
    "wanted_lines",
]
