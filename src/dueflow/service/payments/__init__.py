"""Confirming payments (one path for notifications, queries and operators) and close-or-query.

Confirming is in ``_confirm``, close-or-query in ``_closing``, starting a payment in
``_starting``; callers use this module's names.
"""

from __future__ import annotations

from dueflow.service.payments._closing import (
    attempt_of,
    close_attempts,
    close_each,
    open_attempts,
    opened_since,
)
from dueflow.service.payments._confirm import (
    MANUAL,
    AlsoWrite,
    AttemptCheck,
    PaymentOutcome,
    apply_payment,
    confirm_payment,
    confirm_payment_locked,
    new_pay_no,
    record_manual_payment,
    record_mismatch_at_close,
)
from dueflow.service.payments._starting import MIN_PAY_WINDOW, start_payment

__all__ = [
    "MANUAL",
    "MIN_PAY_WINDOW",
    "AlsoWrite",
    "AttemptCheck",
    "PaymentOutcome",
    "apply_payment",
    "attempt_of",
    "close_attempts",
    "close_each",
    "confirm_payment",
    "confirm_payment_locked",
    "new_pay_no",
    "open_attempts",
    "opened_since",
    "record_manual_payment",
    "record_mismatch_at_close",
    "start_payment",
]
