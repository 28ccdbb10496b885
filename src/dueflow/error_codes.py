"""Every error code dueflow answers with: one registry a client can switch on.

Each :class:`ErrorCode` is the text sent as ``error.code`` (a ``str``, unchanged since clients
first switched on it), with the HTTP status it is answered with, when it happens and what a
client should do (:class:`Action`). Every :class:`~dueflow.exceptions.DueflowError` names its
code here, and so do the answers the API makes itself (a body that is not JSON, a route that does
not exist, a crash): :mod:`dueflow.api.errors` takes the status from the code, the OpenAPI
document lists the codes each route can answer, and docs/errors.md is written from this table
(``tests/unit/test_docs_errors.py`` keeps it in step).

A new code is one member below: its text, its status, its :class:`Action` and when it happens.
Codes that only dueflow's own processes raise (the CLI, the demo) and that no HTTP answer
carries have the status None.
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """What a client should do about an error, by the kind of fault it is."""

    FIX_REQUEST = "fix_request"
    AUTHENTICATE = "authenticate"
    REFETCH = "refetch"
    RETRY = "retry"
    REPORT = "report"

    @property
    def advice(self) -> str:
        """The action in a sentence, for docs/errors.md."""
        return _ADVICE[self]


_ADVICE = {
    Action.FIX_REQUEST: "Change the request (the field named, the body, the path): sent again "
    "unchanged it fails again.",
    Action.AUTHENTICATE: "Send a valid personal token or service key (a new one if this one was "
    "revoked or expired); do not repeat the request as it is.",
    Action.REFETCH: "Fetch what the request is about again (the order, the goods, the show, the "
    "refund, the timer) and act on its current state; the same request fails until that "
    "state changes.",
    Action.RETRY: "Send the same request again after a backoff (exponential, from about a "
    "second), with the same Idempotency-Key where the route takes one.",
    Action.REPORT: "The fault is the server's: report it to its operator; retry later with a "
    "backoff only if the request must go through.",
}

FIX = Action.FIX_REQUEST
AUTH = Action.AUTHENTICATE
REFETCH = Action.REFETCH
RETRY = Action.RETRY
REPORT = Action.REPORT


class ErrorCode(StrEnum):
    """An error code: its text, HTTP status (None: never in an HTTP answer), :class:`Action`,
    and when it happens."""

    status: int | None
    action: Action
    when: str

    def __new__(cls, value: str, status: int | None, action: Action, when: str) -> ErrorCode:
        code = str.__new__(cls, value)
        code._value_ = value
        code.status = status
        code.action = action
        code.when = when
        return code

    # --- the request itself -------------------------------------------------------------------
    MALFORMED_JSON = "malformed_json", 400, FIX, "The body is not valid JSON."
    BAD_REQUEST = (
        "bad_request",
        400,
        FIX,
        "The body cannot be read (not UTF-8 text, a broken form).",
    )
    INVALID_INPUT = (
        "invalid_input",
        422,
        FIX,
        "A value is missing, malformed or out of range, or a field is unknown; `field` names "
        "it (`body.lines[0].quantity`, `query.limit`, `path.order_id`, `header.Idempotency-Key`) "
        "where one field is at fault.",
    )
    UNSAFE_WEBHOOK_URL = (
        "unsafe_webhook_url",
        422,
        FIX,
        "A webhook endpoint's URL is not http(s) with a host, carries a user or password, does "
        "not resolve, or is or resolves to a private, loopback, link-local or reserved address "
        "(unless the deployment allows them); `field` names it.",
    )
    UNSTORABLE_VALUE = (
        "unstorable_value",
        422,
        FIX,
        "The database refused a value: text with characters it cannot hold, or a number out of "
        "its range.",
    )
    BODY_TOO_LARGE = "body_too_large", 413, FIX, "The body is over the size limit (64 KiB)."
    NOT_FOUND = (
        "not_found",
        404,
        FIX,
        "No such route, user, goods, order, show, ticket, SKU, coupon, flash sale, refund or "
        "timer; someone else's order, and a ticket or ticket list of a show not yours, is "
        "answered so too.",
    )
    METHOD_NOT_ALLOWED = (
        "method_not_allowed",
        405,
        FIX,
        "The route exists but not with this method (the `Allow` header lists those it takes).",
    )
    HTTP_ERROR = (
        "http_error",
        400,
        FIX,
        "Another refusal of the HTTP framework's, of a status no other code covers (the "
        "answer's status says which; none is known to happen today).",
    )
    # --- who is calling -----------------------------------------------------------------------
    UNAUTHORIZED = (
        "unauthorized",
        401,
        AUTH,
        "No bearer token or service key, or one nobody holds, revoked or expired.",
    )
    MISSING_SCOPE = (
        "missing_scope",
        403,
        FIX,
        "A service key without the scope the route needs (the message names it): call with a "
        "key that has it.",
    )
    ACT_AS_REQUIRED = (
        "act_as_required",
        400,
        FIX,
        "A service key acting for nobody on a route for a user: name the host's user in the "
        "`Dueflow-Act-As` header.",
    )
    ACT_AS_NOT_ALLOWED = (
        "act_as_not_allowed",
        403,
        FIX,
        "A personal token sent `Dueflow-Act-As` (or `Dueflow-Act-As-Name`): only a service key "
        "acts for someone; a personal token acts for its own user.",
    )
    FORBIDDEN = (
        "forbidden",
        403,
        FIX,
        "The HTTP framework refused the caller (none of dueflow's routes answers it today).",
    )
    NOT_ALLOWED = (
        "not_allowed",
        403,
        FIX,
        "The caller may not do this: an admin's route, another seller's SKU or template, one's "
        "own goods.",
    )
    NOT_YOUR_ROLE = (
        "not_your_role",
        403,
        FIX,
        "The order is the caller's, but the move is its other party's (a buyer shipping, a "
        "seller paying).",
    )
    # --- the state of things ------------------------------------------------------------------
    REFUSED = "refused", 400, FIX, "The request was refused (a refusal no other code covers)."
    CONFLICT = (
        "conflict",
        409,
        REFETCH,
        "The change conflicts with what is stored: a duplicate, a reference to a row that is "
        "gone, a service key revoked (or expired) already.",
    )
    INVALID_TRANSITION = (
        "invalid_transition",
        409,
        REFETCH,
        "The order's (or refund's) status does not allow this move: paid already, cancelled, "
        "not shipped yet.",
    )
    GOODS_UNAVAILABLE = (
        "goods_unavailable",
        409,
        REFETCH,
        "The goods are held by another order, sold or off sale (held goods come back if that "
        "order is not paid in time).",
    )
    SEAT_UNAVAILABLE = (
        "seat_unavailable",
        409,
        REFETCH,
        "A seat asked for is held by another order or sold: fetch the seat map and choose again.",
    )
    OUT_OF_STOCK = (
        "out_of_stock",
        409,
        REFETCH,
        "Not enough units left of a SKU or a flash sale.",
    )
    SEAT_LIMIT_EXCEEDED = (
        "seat_limit_exceeded",
        409,
        FIX,
        "The order would take the buyer past the show's per-buyer seat limit: ask fewer seats.",
    )
    PURCHASE_LIMIT_EXCEEDED = (
        "purchase_limit_exceeded",
        409,
        FIX,
        "The order would take the buyer past a flash sale's per-buyer limit: ask fewer units.",
    )
    SALES_CLOSED = (
        "sales_closed",
        409,
        REFETCH,
        "The show takes no orders (its sales closed, it started or was cancelled), or a flash "
        "sale has not started or has ended.",
    )
    TICKET_CHECKED_IN = (
        "ticket_checked_in",
        409,
        REFETCH,
        "The ticket was checked in already; the message says when (ISO 8601, UTC) and at which "
        "gate: the door refuses it.",
    )
    TICKET_VOID = (
        "ticket_void",
        409,
        REFETCH,
        "The ticket is void: its show or its order was cancelled; the door refuses it.",
    )
    COUPON_UNUSABLE = (
        "coupon_unusable",
        409,
        FIX,
        "The coupon cannot go with this order (expired, not yet valid, used, locked by another "
        "order, another seller's, under its minimum), or a template has no coupon left to issue.",
    )
    IDEMPOTENCY_KEY_REUSED = (
        "idempotency_key_reused",
        409,
        FIX,
        "The Idempotency-Key was used by this caller for a different request (another route, "
        "path or body) within 24 hours: a new request takes a new key.",
    )
    IDEMPOTENCY_KEY_IN_USE = (
        "idempotency_key_in_use",
        409,
        RETRY,
        "A request with this Idempotency-Key is still being answered (or died less than its "
        "lease ago): send it again, with the same key, after a backoff.",
    )
    PAYMENT_MISMATCH = (
        "payment_mismatch",
        409,
        REPORT,
        "A payment does not match what the order owes.",
    )
    TIMER_NOT_WAITING = (
        "timer_not_waiting",
        409,
        REFETCH,
        "Run now: the timer is claimed by a worker, done or cancelled.",
    )
    BUSY = (
        "busy",
        409,
        RETRY,
        "Someone else holds the order or the rows right now (a lock, a deadlock, a payment "
        "started meanwhile).",
    )
    # --- dueflow's backends and the payment providers -----------------------------------------
    BACKEND_ERROR = "backend_error", 503, RETRY, "A backend failed."
    BACKEND_UNAVAILABLE = (
        "backend_unavailable",
        503,
        RETRY,
        "The database (or another backend: the timer trigger, Redis) cannot be reached.",
    )
    DELIVERY_UNKNOWN = (
        "delivery_unknown",
        503,
        RETRY,
        "A notifier sent but got no answer (the worker's, never an API answer).",
    )
    PROVIDER_ERROR = (
        "provider_error",
        502,
        REPORT,
        "The payment provider answered with an error.",
    )
    PROVIDER_UNAVAILABLE = (
        "provider_unavailable",
        503,
        RETRY,
        "The payment provider's answer is unknown (a timeout, its system error).",
    )
    INTERNAL_ERROR = "internal_error", 500, REPORT, "Something nobody expected failed (a bug)."
    ERROR = "error", 500, REPORT, "dueflow failed (an error no other code covers)."
    BAD_CONFIG = "bad_config", 500, REPORT, "The server's settings are invalid."
    NOT_MIGRATED = (
        "not_migrated",
        500,
        REPORT,
        "The database schema is not at the revision the server needs (`dueflow migrate`).",
    )
    # --- provider notifications (answered to the provider, in its own terms) ------------------
    NOTIFICATION_REJECTED = (
        "notification_rejected",
        400,
        REPORT,
        "A provider notification failed verification.",
    )
    BAD_SIGNATURE = "bad_signature", 400, REPORT, "A notification's signature does not verify."
    STALE_TIMESTAMP = (
        "stale_timestamp",
        400,
        REPORT,
        "A notification's signed timestamp is more than 5 minutes away from now.",
    )
    MALFORMED_NOTIFICATION = (
        "malformed_notification",
        400,
        REPORT,
        "A notification's field is missing or unreadable.",
    )
    AMOUNT_MISMATCH = (
        "amount_mismatch",
        400,
        REPORT,
        "A notification's amount differs from the payment's.",
    )
    WRONG_MERCHANT = (
        "wrong_merchant",
        400,
        REPORT,
        "A notification names another app, merchant or seller.",
    )
    # --- dueflow's own processes (never in an HTTP answer) ------------------------------------
    BAD_SERVER = (
        "bad_server",
        None,
        FIX,
        "`dueflow demo --url`: the server is unreachable, not dueflow, or the admin token is "
        "wrong.",
    )
    SERVER_LOST = (
        "server_lost",
        None,
        REPORT,
        "`dueflow demo --url`: the server stopped answering sensibly.",
    )


def code_of(text: str) -> ErrorCode:
    """The code whose text is ``text`` (KeyError when none is)."""
    return _BY_TEXT[text]


_BY_TEXT = {code.value: code for code in ErrorCode}

#: The code of each refusal the HTTP framework makes itself (an unknown route, a wrong method,
#: a missing token, a body too large), by status.
FOR_HTTP_STATUS = {
    400: ErrorCode.BAD_REQUEST,
    401: ErrorCode.UNAUTHORIZED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.BODY_TOO_LARGE,
}
