"""The ``manual`` provider: an operator records money received off-line (bank transfer, cash).

There is no trade at any provider, so close-or-query answers closed-unpaid: an unpaid manual
attempt cannot be paid behind our back.
"""

from __future__ import annotations

from datetime import datetime

from dueflow.payments.base import Attempt, CloseOutcome, PaymentProvider


class ManualProvider(PaymentProvider):
    """Payments recorded by an operator."""

    name = "manual"

    async def close_or_query(self, attempt: Attempt, now: datetime) -> CloseOutcome:
        return CloseOutcome.closed("manual payments have no trade to close")
