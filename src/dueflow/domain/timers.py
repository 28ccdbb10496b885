"""Timer kinds, timer states and the retry backoff."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum


class TimerKind(StrEnum):
    """What a timer does when it fires."""

    PAY_REMINDER = "pay_reminder"
    CANCEL_UNPAID = "cancel_unpaid"
    CANCEL_UNSHIPPED = "cancel_unshipped"
    CONFIRM_RECEIPT = "confirm_receipt"
    AUTO_REVIEW = "auto_review"
    REFUND_CHECK = "refund_check"
    #: Close at their providers the attempts a paid order left open (no paying twice).
    CLOSE_ATTEMPTS = "close_attempts"
    #: The organizer cancelled the order's show: cancel the order (refund it if paid).
    SHOW_CANCEL = "show_cancel"
    #: Tell the buyer their order was closed (every cancel writes one; sent once).
    ORDER_CLOSED = "order_closed"


#: The kinds whose lateness costs the business: cancels (unpaid, unshipped, a cancelled show's),
#: receipts, reviews and refund checks. A worker that is behind claims these first.
MUST_HAPPEN = frozenset(
    {
        TimerKind.CANCEL_UNPAID,
        TimerKind.CANCEL_UNSHIPPED,
        TimerKind.SHOW_CANCEL,
        TimerKind.CONFIRM_RECEIPT,
        TimerKind.AUTO_REVIEW,
        TimerKind.REFUND_CHECK,
    }
)
#: The messages: pay reminders, close notices and the closes of attempts a paid order left open.
#: Late, they cost a nuisance, never a seat or a unit held from the next buyer.
MESSAGES = frozenset(TimerKind) - MUST_HAPPEN
#: While a worker is behind, at least one timer in this many of each claim (10 of 200, 100 of
#: 2,000) is taken in due order whatever its kind: messages still move, at a twentieth of the
#: claim rate at least, and the must-happen timers keep the rest (19 in 20).
DUE_ORDER_SHARE = 20


def due_order_share(limit: int) -> int:
    """How many of a claim of ``limit`` go in due order whatever the kind while behind."""
    return max(1, limit // DUE_ORDER_SHARE)


class TimerState(StrEnum):
    """A timer's life: scheduled -> claimed (with a lease) -> done | cancelled; failures go back
    to scheduled, and at ``max_attempts`` failures in a row to parked, where an operator runs it
    again."""

    SCHEDULED = "scheduled"
    CLAIMED = "claimed"
    DONE = "done"
    CANCELLED = "cancelled"
    #: Its handler failed on it ``max_attempts`` times in a row: no worker takes it again until an
    #: operator runs it again (dashboard, alert, ``dueflow timers run-again``).
    PARKED = "parked"


BACKOFF_FIRST = timedelta(seconds=30)
BACKOFF_CAP = timedelta(minutes=10)
STUCK_AFTER_ATTEMPTS = 5
#: Failures in a row after which a timer is parked (``DUEFLOW_TIMER_MAX_ATTEMPTS``).
MAX_ATTEMPTS = 20


def backoff(attempts: int) -> timedelta:
    """How long to wait before the next try after ``attempts`` failed tries (30 s doubling, 10 min cap)."""
    if attempts < 1:
        attempts = 1
    # 2**5 * 30 s already exceeds the cap; avoid huge powers.
    delay: timedelta = BACKOFF_FIRST * (2 ** min(attempts - 1, 10))
    return min(delay, BACKOFF_CAP)


QUICK_FIRST = timedelta(seconds=2)
#: Tries on the quick schedule before the usual backoff takes over: 2, 4, 8, 16 s, then every
#: 30 s up to the eighth, about three minutes in all (past the providers' two-minute margin).
QUICK_ATTEMPTS = 8


def quick_backoff(attempts: int) -> timedelta:
    """The wait before the next try of what is usually over a moment later (a lost database
    connection, a busy lock, a payment whose state is not known yet: a start still on its way, a
    payment started meanwhile, a trade the provider may still show until its expiry plus two
    minutes): 2 s doubling to 30 s, every 30 s up to the eighth try, then the usual backoff
    (1 min doubling to 10 min). Waiting 30 s doubling from the first failure left orders past
    their deadline for nothing (the chaos soak found cancels 30-40 s late, and with doubling
    from 2 s, a trade decidable at two minutes was only tried again at three)."""
    if attempts < 1:
        attempts = 1
    if attempts > QUICK_ATTEMPTS:
        return backoff(attempts - QUICK_ATTEMPTS + 1)
    quick: timedelta = QUICK_FIRST * (2 ** (attempts - 1))
    return min(quick, BACKOFF_FIRST)


def is_stuck(attempts: int) -> bool:
    """A timer that failed this many times is flagged for operators (and still retried)."""
    return attempts >= STUCK_AFTER_ATTEMPTS


def is_parked(failures: int, max_attempts: int) -> bool:
    """A timer whose handler has now failed on it ``failures`` times in a row (claims that
    ended in the handler's own retry, a lease run out or a success count none) is parked
    rather than retried."""
    return failures >= max_attempts


#: What an order in each status did before a timer that waits on another status fired: the
#: reason the timer does nothing. The status stays in the words after ``order is`` (operators
#: and the soak's checker read it).
_MOVED_ON_BY = {
    "pending_payment": "not paid yet",
    "pending_shipment": "paid before this timer",
    "paid": "paid before this timer",
    "shipped": "shipped before this timer",
    "received": "received before this timer",
    "completed": "completed before this timer",
    "cancelled_unpaid": "cancelled before this timer",
    "cancelled_unshipped": "cancelled before this timer",
    "cancelled_paid": "cancelled with its show before this timer",
}
#: The outcome of a timer whose order is gone.
SKIPPED_ORDER_MISSING = "skipped: order missing"
#: The outcome of a pay reminder that came at or after its order's pay deadline: the order is
#: still pending payment, but the reminder is too late to make sense (its cancel is on the way).
SKIPPED_PAY_DEADLINE_PASSED = "skipped: pay deadline passed"
#: The outcome of a deadline timer whose order still waits past its deadline, yet did not move
#: (its guarded move found it otherwise): none of the reasons above.
NOT_MOVED = "its move did not apply"


def skipped_moved_on(status: str) -> str:
    """The outcome of a timer whose order moved on before it fired, with the reason:
    ``skipped: order is pending_shipment (paid before this timer)``."""
    return f"skipped: order is {status} ({_MOVED_ON_BY.get(status, 'moved on')})"


def skipped_not_moved(status: str) -> str:
    """The outcome of a deadline timer whose order waits in ``status`` past its deadline and
    still did not move."""
    return f"skipped: order is {status} ({NOT_MOVED})"
