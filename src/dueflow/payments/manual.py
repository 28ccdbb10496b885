"""The ``manual`` provider: an operator records money received off-line (bank transfer, cash).

There is no trade at any provider, so close-or-query answers closed-unpaid: an unpaid manual
attempt cannot be paid behind our back. Its refunds are paid back off-line: approving one records
it as succeeded.
"""

from __future__ import annotations

from datetime import datetime

from dueflow.payments.base import (
    Attempt,
    CloseOutcome,
    PaymentProvider,
    RefundOutcome,
    RefundRequest,
    RefundResult,
)


class ManualProvider(PaymentProvider):
    """Payments recorded by an operator."""

    name = "manual"

    async def close_or_query(self, attempt: Attempt, now: datetime) -> CloseOutcome:
        return CloseOutcome.closed("manual payments have no trade to close")

    async def refund(self, request: RefundRequest) -> RefundOutcome:
        # The operator who approves a manual refund pays it back off-line and records it so.
        return RefundOutcome(RefundResult.SUCCEEDED, "paid back off-line by the operator")
