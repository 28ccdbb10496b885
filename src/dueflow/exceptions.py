"""Every error dueflow raises on purpose.

The tree::

    DueflowError
    ├── ConfigError                  bad settings (a duration like ``3x``, an unknown URL scheme)
    │   └── NotMigrated              the database schema is not at the revision this code needs
    ├── DomainError                  the request is understood and refused
    │   ├── InvalidInput             a value is malformed or out of range
    │   │   ├── UnstorableValue      the database refused a value (text it cannot hold, a number
    │   │   │                        out of range): the same request can never succeed
    │   │   └── UnsafeURL            a webhook URL that is not http(s) or names a private,
    │   │                            loopback, link-local or other non-public address
    │   ├── Conflict                 a constraint refused the change (a duplicate, a missing row)
    │   ├── NotFound                 no such user, goods, order or payment
    │   ├── NotAllowed               the caller may not do this (not your order, own goods)
    │   │   └── NotYourRole          the order's other party does this (a buyer shipping)
    │   ├── Unauthenticated          no credential, or one unknown, revoked or expired
    │   ├── MissingScope             a service key without the scope the route needs
    │   ├── ActAsRequired            a service key acting for nobody on a route for a user
    │   ├── ActAsNotAllowed          a personal token asking to act for someone
    │   ├── InvalidTransition        the order's status does not allow this event
    │   ├── GoodsUnavailable         the goods are held by another order, sold or off sale
    │   │   └── SeatUnavailable      a seat is held by another order or sold
    │   ├── SeatLimitExceeded        past the show's per-buyer seat limit
    │   ├── SalesClosed              the show takes no orders (closed, started, cancelled)
    │   ├── TicketCheckedIn          the ticket was checked in already (when, at which gate)
    │   ├── TicketVoid               the ticket's show or order was cancelled
    │   ├── PaymentMismatch          a payment's amount differs from what is owed
    │   └── TimerNotWaiting          run now: the timer is claimed by a worker, done or cancelled
    ├── BackendError                 a database, trigger or notifier failed
    │   ├── BackendUnavailable       it cannot be reached
    │   │   └── DatabaseUnavailable  the database cannot be reached (refused, reset, timed out,
    │   │                            a host that does not resolve)
    │   ├── Busy                     it is locked by someone else right now: try again
    │   └── DeliveryUnknown          a notifier sent but got no answer: it may have been delivered
    ├── ProviderError                a payment provider failed
    │   └── ProviderUnavailable      its answer is unknown (timeout, system error): try again
    └── NotificationRejected         a provider notification failed verification
        ├── BadSignature             the signature does not verify (or is a probe)
        ├── StaleTimestamp           the signed timestamp is outside the 5-minute window
        ├── MalformedNotification    a field is missing or unreadable
        ├── AmountMismatch           the amount differs from what the payment owes
        └── WrongMerchant            it names another app, merchant or seller

Each class docstring is its default message; each class names its code in the registry of
:mod:`dueflow.error_codes` (a subclass without one answers its parent's).
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from dueflow.error_codes import ErrorCode


class DueflowError(Exception):
    """dueflow failed."""

    code: ClassVar[ErrorCode] = ErrorCode.ERROR

    def __init__(self, message: str | None = None) -> None:
        self.message = message or (type(self).__doc__ or "").strip()
        super().__init__(self.message)


class ConfigError(DueflowError):
    """The settings are invalid."""

    code = ErrorCode.BAD_CONFIG


class NotMigrated(ConfigError):
    """The database schema is not at the revision this dueflow needs: run `dueflow migrate`."""

    code = ErrorCode.NOT_MIGRATED


class DomainError(DueflowError):
    """The request was refused."""

    code = ErrorCode.REFUSED


class InvalidInput(DomainError):
    """A value is malformed or out of range."""

    code = ErrorCode.INVALID_INPUT

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        #: The input at fault as the request names it (``lines[0].quantity``, ``after``), when
        #: one is: the API answers it as ``error.field``, located (``body.``, ``query.``).
        self.field = field
        super().__init__(message)


class UnstorableValue(InvalidInput):
    """A value cannot be stored: text with characters the database refuses, or a number out of
    range."""

    code = ErrorCode.UNSTORABLE_VALUE


class UnsafeURL(InvalidInput):
    """A webhook URL must be http(s) and reach only public addresses (a private, loopback,
    link-local, unspecified, multicast or reserved one is refused unless
    DUEFLOW_WEBHOOK_ALLOW_PRIVATE is set)."""

    code = ErrorCode.UNSAFE_WEBHOOK_URL

    def __init__(self, message: str | None = None, *, field: str | None = "url") -> None:
        super().__init__(message, field=field)


class Conflict(DomainError):
    """The change conflicts with what is stored (a duplicate, or a reference to a missing row)."""

    code = ErrorCode.CONFLICT


class NotFound(DomainError):
    """Not found."""

    code = ErrorCode.NOT_FOUND


class NotAllowed(DomainError):
    """You may not do this."""

    code = ErrorCode.NOT_ALLOWED


class NotYourRole(NotAllowed):
    """The order is yours, but this is for its other party to do."""

    code = ErrorCode.NOT_YOUR_ROLE


class Unauthenticated(DomainError):
    """A bearer token or a service key is required."""

    code = ErrorCode.UNAUTHORIZED


class MissingScope(DomainError):
    """The service key lacks the scope this route needs."""

    code = ErrorCode.MISSING_SCOPE

    def __init__(self, scope: str) -> None:
        self.scope = scope
        super().__init__(f"the service key lacks the scope {scope!r}")


class ActAsRequired(DomainError):
    """This route acts for a user: a service key names one with the Dueflow-Act-As header."""

    code = ErrorCode.ACT_AS_REQUIRED


class ActAsNotAllowed(DomainError):
    """Only a service key may act for a user (Dueflow-Act-As); a personal token acts for its
    own user."""

    code = ErrorCode.ACT_AS_NOT_ALLOWED


class InvalidTransition(DomainError):
    """The order's status does not allow this."""

    code = ErrorCode.INVALID_TRANSITION

    def __init__(self, message: str | None = None, *, status: str | None = None) -> None:
        self.status = status
        super().__init__(message)


class GoodsUnavailable(DomainError):
    """The goods are not available: held by another order, sold or off sale."""

    code = ErrorCode.GOODS_UNAVAILABLE


class SeatUnavailable(GoodsUnavailable):
    """A seat asked for is held by another order or sold."""

    code = ErrorCode.SEAT_UNAVAILABLE


class SeatLimitExceeded(DomainError):
    """The order would take the buyer past the show's per-buyer seat limit."""

    code = ErrorCode.SEAT_LIMIT_EXCEEDED


class SalesClosed(DomainError):
    """The show takes no orders: its sales closed, it started or it was cancelled (or a flash
    sale has not started or has ended)."""

    code = ErrorCode.SALES_CLOSED


class TicketCheckedIn(DomainError):
    """The ticket was checked in already."""

    code = ErrorCode.TICKET_CHECKED_IN

    def __init__(
        self, message: str | None = None, *, checked_in_at: datetime, gate: str | None
    ) -> None:
        self.checked_in_at = checked_in_at
        self.gate = gate
        super().__init__(message)


class TicketVoid(DomainError):
    """The ticket is void: its show or its order was cancelled."""

    code = ErrorCode.TICKET_VOID


class OutOfStock(GoodsUnavailable):
    """Not enough units left: of a SKU, or of a flash sale."""

    code = ErrorCode.OUT_OF_STOCK


class PurchaseLimitExceeded(SeatLimitExceeded):
    """The order would take the buyer past a flash sale's per-buyer limit."""

    code = ErrorCode.PURCHASE_LIMIT_EXCEEDED


class CouponUnusable(DomainError):
    """The coupon cannot go with this order: expired, not yet valid, used, locked by another
    order, or the order is below its minimum amount."""

    code = ErrorCode.COUPON_UNUSABLE


class IdempotencyKeyReused(Conflict):
    """The Idempotency-Key was used by this caller for a different request."""

    code = ErrorCode.IDEMPOTENCY_KEY_REUSED


class IdempotencyKeyInUse(Conflict):
    """A request with this Idempotency-Key is still being answered; try again shortly."""

    code = ErrorCode.IDEMPOTENCY_KEY_IN_USE


class PaymentMismatch(DomainError):
    """The payment does not match what the order owes."""

    code = ErrorCode.PAYMENT_MISMATCH


class TimerNotWaiting(DomainError):
    """The timer is not waiting: a worker holds it, or it is done or cancelled."""

    code = ErrorCode.TIMER_NOT_WAITING


class BackendError(DueflowError):
    """A backend failed."""

    code = ErrorCode.BACKEND_ERROR


class BackendUnavailable(BackendError):
    """A backend cannot be reached."""

    code = ErrorCode.BACKEND_UNAVAILABLE


class DatabaseUnavailable(BackendUnavailable):
    """The database is unavailable; try again later."""


class Busy(BackendError):
    """Busy: someone else holds the lock right now; try again."""

    code = ErrorCode.BUSY


class DeliveryUnknown(BackendError):
    """The delivery was sent but not answered (a read timeout): it may have reached the receiver."""

    code = ErrorCode.DELIVERY_UNKNOWN


class ProviderError(DueflowError):
    """A payment provider failed."""

    code = ErrorCode.PROVIDER_ERROR


class ProviderUnavailable(ProviderError):
    """The payment provider's answer is unknown; try again later."""

    code = ErrorCode.PROVIDER_UNAVAILABLE

    def __init__(self, message: str | None = None, *, answered: bool = False) -> None:
        #: The provider (or a proxy in front of it) did answer, so the request is over and can
        #: take no effect later; False (the safe default) when it may still be on its way.
        self.answered = answered
        super().__init__(message)


class NotificationRejected(DueflowError):
    """The notification failed verification."""

    code = ErrorCode.NOTIFICATION_REJECTED


class BadSignature(NotificationRejected):
    """The signature does not verify."""

    code = ErrorCode.BAD_SIGNATURE


class StaleTimestamp(NotificationRejected):
    """The signed timestamp is more than 5 minutes away from now."""

    code = ErrorCode.STALE_TIMESTAMP


class MalformedNotification(NotificationRejected):
    """The notification is malformed: a field is missing or unreadable."""

    code = ErrorCode.MALFORMED_NOTIFICATION


class AmountMismatch(NotificationRejected):
    """The notified amount differs from the payment's amount."""

    code = ErrorCode.AMOUNT_MISMATCH


class WrongMerchant(NotificationRejected):
    """The notification is for another app, merchant or seller."""

    code = ErrorCode.WRONG_MERCHANT
