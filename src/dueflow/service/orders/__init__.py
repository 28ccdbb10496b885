"""What buyers and sellers do to orders.

Placing is in ``_placing``, the parties' moves (cancel, ship, confirm receipt, review) in
``_moves``, the order's view in ``_view``; callers use this module's names.
"""

from __future__ import annotations

from dueflow.service.orders._moves import (
    cancel_by_buyer,
    cancel_by_seller,
    confirm_receipt,
    review,
    ship,
)
from dueflow.service.orders._placing import (
    finish_placing,
    insert_placed,
    known_buyer,
    new_view,
    place_by_token,
    place_order,
    place_order_view,
)
from dueflow.service.orders._view import order_view, view_in

__all__ = [
    "cancel_by_buyer",
    "cancel_by_seller",
    "confirm_receipt",
    "finish_placing",
    "insert_placed",
    "known_buyer",
    "new_view",
    "order_view",
    "place_by_token",
    "place_order",
    "place_order_view",
    "review",
    "ship",
    "view_in",
]
