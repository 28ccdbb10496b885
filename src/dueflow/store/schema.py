"""The tables (SQLAlchemy Core). Alembic migrations in ``migrations/`` create exactly these.

One metadata for every table; the tables are written by area in private modules and re-exported
here, so callers keep ``schema.orders``, ``schema.timers``, ...:

- ``_schema_orders``: users, goods, orders, order_lines, order_counts, idempotency_keys,
  reviews
- ``_schema_shows``: shows, seats, seat_holds, show_buyers, tickets
- ``_schema_shop``: skus, coupon_templates, coupons, flash_sales, flash_buyers
- ``_schema_payments``: payments, refunds, discrepancies, notifications
- ``_schema_timers``: timers, reminders
- ``_schema_events``: order_events, event_sequence, event_deliveries
- ``_schema_keys``: api_keys
- ``_schema_webhooks``: webhook_endpoints
"""

from __future__ import annotations

from dueflow.store._schema_base import metadata
from dueflow.store._schema_events import event_deliveries, event_sequence, order_events
from dueflow.store._schema_keys import api_keys
from dueflow.store._schema_orders import (
    goods,
    idempotency_keys,
    order_counts,
    order_lines,
    orders,
    reviews,
    users,
)
from dueflow.store._schema_payments import discrepancies, notifications, payments, refunds
from dueflow.store._schema_shop import coupon_templates, coupons, flash_buyers, flash_sales, skus
from dueflow.store._schema_shows import seat_holds, seats, show_buyers, shows, tickets
from dueflow.store._schema_timers import (
    LIVE_TIMERS,
    PARKED_TIMERS,
    STUCK_TIMERS,
    reminders,
    timers,
)
from dueflow.store._schema_webhooks import webhook_endpoints
from dueflow.store.types import Id

__all__ = [
    "LIVE_TIMERS",
    "PARKED_TIMERS",
    "STUCK_TIMERS",
    "Id",
    "api_keys",
    "coupon_templates",
    "coupons",
    "discrepancies",
    "event_deliveries",
    "event_sequence",
    "flash_buyers",
    "flash_sales",
    "goods",
    "idempotency_keys",
    "metadata",
    "notifications",
    "order_counts",
    "order_events",
    "order_lines",
    "orders",
    "payments",
    "refunds",
    "reminders",
    "reviews",
    "seat_holds",
    "seats",
    "show_buyers",
    "shows",
    "skus",
    "tickets",
    "timers",
    "users",
    "webhook_endpoints",
]
