"""What the JSON API's resources share in the OpenAPI schema: the text, money and time types,
:class:`View` (every answer's base), the error answer (:class:`ErrorBody`, :func:`errors`), and
the order's view with its parts, which the orders, lists, refunds and admin routes all answer.
Each resource's own answers are beside its routes (``api/goods.py``, ``api/shows.py``, ...).

The routes still build their JSON themselves (:func:`dueflow.api.common.answer`): these models
document the wire format, they do not produce it. Money is exact decimal text with two places
(``"12.50"``), datetimes are ISO 8601 with their UTC offset (``"2026-03-01T12:00:00+00:00"``).
Every model refuses fields it does not name, so the schema says exactly what is sent.

:data:`SingleLine` and :data:`MultiLine` are the text types of every free-text field of a request
body (:mod:`dueflow.domain.text` says which characters they refuse): bad text is answered 422
naming the field before anything reaches the database. :data:`Time` is the type of every time
field of a request body: ISO 8601 with its offset, within what every database stores
(:mod:`dueflow.domain.times`), else 422 naming the field.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema

from dueflow import error_codes
from dueflow.domain import text, times
from dueflow.error_codes import ErrorCode

#: Yuan as exact decimal text with two places.
Money = Annotated[
    str,
    Field(
        pattern=r"^-?[0-9]+\.[0-9]{2}$",
        examples=["12.50"],
        description="yuan, exact decimal text with two places",
    ),
]


def _multi_line(value: str) -> str:
    return text.checked(value, multiline=True)


#: One line of text from a client: no control characters, lone surrogates or noncharacters.
SingleLine = Annotated[str, AfterValidator(text.checked)]
#: Text that may span lines (a review comment): as :data:`SingleLine`, but tab, line feed and
#: carriage return are kept.
MultiLine = Annotated[str, AfterValidator(_multi_line)]
#: A time from a client, in UTC: ISO 8601 text with its offset, from 1000-01-01 to 9999-12-31
#: in UTC (what every database stores); anything else is 422 naming the field.
Time = Annotated[
    datetime,
    PlainValidator(times.parse, json_schema_input_type=str),
    WithJsonSchema(
        {
            "type": "string",
            "examples": [times.EXAMPLE],
            "description": "ISO 8601 with its UTC offset, 1000-01-01 to 9999-12-31 in UTC",
        }
    ),
]


class View(BaseModel):
    """An answer's shape: every field required (nullable ones are sent as null), none more."""

    model_config = ConfigDict(extra="forbid")


#: The codes an HTTP answer can carry, as the schema's enum (the registry's other codes are
#: only raised inside dueflow's own processes).
API_CODES = [code for code in ErrorCode if code.status is not None]


class ErrorDetail(View):
    """What went wrong: a stable machine code (docs/errors.md says what each means and what to
    do), a message for people, and the field at fault when one is."""

    code: Annotated[
        ErrorCode,
        WithJsonSchema(
            {
                "type": "string",
                "enum": [str(code) for code in API_CODES],
                "title": "ErrorCode",
                "description": "docs/errors.md: when each happens, what a client should do",
            }
        ),
    ] = Field(examples=["not_found"])
    message: str = Field(examples=["no order 7"])
    field: str | None = Field(
        examples=["body.lines[0].quantity"],
        description="the input at fault, where it is (body., query., path., header.); "
        "null when no one field is",
    )


class ErrorBody(View):
    """Every error answer of the JSON API."""

    error: ErrorDetail


class PaymentView(View):
    """One payment attempt of an order."""

    id: int
    pay_no: str
    order_id: int
    provider: str
    amount: Money
    expires_at: datetime
    state: str = Field(description="open | paid | closed")
    provider_trade_no: str | None
    created_at: datetime
    handled_at: datetime | None
    start_answer: str | None = Field(
        description="created | refused: what the provider answered to the start; null: unknown"
    )
    provider_refunded: Money | None = Field(
        default=None,
        description="what the provider gave back by itself (Alipay's cancel of a trade paid "
        "meanwhile): no refund of dueflow's is due for it; null: nothing",
    )


class RefundView(View):
    """One refund of an order (one per paid attempt)."""

    id: int
    refund_no: str
    order_id: int
    payment_id: int
    provider: str
    amount: Money
    reason: str
    state: str = Field(
        description="pending_review | processing | succeeded | failed | rejected | settled_offline"
    )
    last_error: str | None
    created_at: datetime
    updated_at: datetime


class ReviewView(View):
    """A review by the buyer or the seller (``is_default`` when given on their behalf)."""

    id: int
    order_id: int
    role: str = Field(description="buyer | seller")
    author_id: int
    rating: int
    comment: str
    is_default: bool
    created_at: datetime


class OrderTimerView(View):
    """A timer of an order as its buyer and seller see it: when it is due, its state, attempts
    and how it ended. Which worker holds it and its last error are the operators' (they are in
    :class:`TimerView`, under ``/api/admin``)."""

    id: int
    order_id: int
    kind: str
    deadline_at: datetime
    due_at: datetime
    state: str = Field(description="scheduled | claimed | done | cancelled | parked")
    attempts: int
    stuck: bool
    outcome: str | None
    created_at: datetime
    done_at: datetime | None


class TimerView(OrderTimerView):
    """A timer as operators see it: as :class:`OrderTimerView`, with the worker's claim
    (``claim_token`` until ``lease_until``) and the last error of a failed try."""

    lease_until: datetime | None
    claim_token: str | None
    last_error: str | None
    failures: int = Field(
        description="its handler's failures on it in a row; parked at DUEFLOW_TIMER_MAX_ATTEMPTS"
    )
    trace_parent: str | None = Field(
        None,
        description="the W3C traceparent of the span that armed it, where its handler's span "
        "links to (null while tracing was off)",
    )


class OverdueTimer(TimerView):
    """A live timer past due, with its order's status."""

    order_status: str


class EventView(View):
    """One line of an order's timeline."""

    id: int
    order_id: int
    at: datetime
    event: str
    actor: str
    from_status: str | None
    to_status: str | None
    detail: str | None
    seq: int | None = Field(
        description="its place in the events feed (GET /api/events); null for a second or so "
        "after it was written"
    )


class OrderListItem(View):
    """An order as lists show it: its own fields, without its payments, refunds, reviews,
    timers and timeline (``GET /api/orders/{id}`` has those)."""

    id: int
    flow: str = Field(description="the order's life, chosen by what it holds: marketplace, tickets")
    order_type: str = Field(description="picks the durations (normal, flash, ticket)")
    buyer_id: int
    seller_id: int = Field(description="the goods' seller, the show's organizer")
    goods_id: int | None = Field(description="the goods, for a marketplace order")
    show_id: int | None = Field(description="the show, for a tickets order")
    amount: Money
    status: str
    created_at: datetime
    pay_deadline: datetime
    paid_at: datetime | None
    ship_deadline: datetime | None
    shipped_at: datetime | None
    carrier: str | None
    tracking_no: str | None
    receive_deadline: datetime | None
    received_at: datetime | None
    review_deadline: datetime | None
    completed_at: datetime | None
    cancelled_at: datetime | None
    cancel_reason: str | None
    updated_at: datetime


class LineView(View):
    """One thing the order holds (or held): goods, a seat, units of a SKU or of a flash sale,
    a coupon."""

    kind: str = Field(description="goods | seat | sku | flash | coupon")
    item_id: int = Field(description="the goods', seat's, SKU's, flash sale's or coupon's id")
    label: str = Field(description="the goods' or SKU's title, the seat's label, ...")
    quantity: int
    price: Money = Field(description="each (a coupon: the amount it takes off)")


class NoticeView(View):
    """A message to the buyer about the order: a payment reminder or the order-closed notice."""

    kind: str = Field(description="pay_reminder | order_closed")
    state: str = Field(description="pending | sending | sent | unknown")
    deliveries: int
    created_at: datetime
    sent_at: datetime | None


class TicketView(View):
    """A ticket of a paid tickets order: one per seat, its code unguessable."""

    seat: str = Field(description="the seat's label")
    code: str
    state: str = Field(description="valid | void (the show was cancelled)")
    checked_in_at: datetime | None = Field(description="when it was checked in at the door")
    gate: str | None = Field(description="where it was checked in (null: no gate was named)")


class OrderView(OrderListItem):
    """The order with what it holds, its deadlines, payments, refunds, reviews, tickets, timers
    and timeline."""

    lines: list[LineView]
    tickets: list[TicketView]
    payments: list[PaymentView]
    refunds: list[RefundView]
    reviews: list[ReviewView]
    timers: list[OrderTimerView]
    notices: list[NoticeView]
    timeline: list[EventView]


#: The statuses errors are answered with, and what each means.
ERROR_MEANING = {
    400: "The body is not JSON, or the request was refused (`act_as_required`: a service key "
    "acting for nobody on a route for a user)",
    401: "No bearer token or service key, or one nobody holds, revoked or expired",
    403: "The caller may not do this (`not_your_role`: the order's other party does this; "
    "`missing_scope`: a service key without the route's scope; `act_as_not_allowed`: a personal "
    "token sending Dueflow-Act-As)",
    404: "No such thing (someone else's order looks missing too)",
    405: "The route does not take this method",
    409: "Conflict with the current state (held, sold, busy, wrong status)",
    413: "The body is over the size limit",
    422: "Invalid input: unknown fields, wrong types, values out of range (`field` names it)",
    500: "A fault of the server's",
    502: "The payment provider answered with an error",
    503: "The database or the payment provider is unavailable",
}

_ERROR_REF = "#/components/schemas/ErrorBody"


def errors(*codes: ErrorCode) -> dict[int | str, dict[str, Any]]:
    """``responses=`` documenting the error answers carrying ``codes``: one per status, an
    :class:`ErrorBody` whose ``code`` is one of that status's codes here."""
    statuses: dict[int, list[ErrorCode]] = {}
    for code in codes:
        assert code.status is not None, f"{code} is never an HTTP answer"
        found = statuses.setdefault(code.status, [])
        if code not in found:
            found.append(code)
    return {
        status: {
            "model": ErrorBody,
            "description": ERROR_MEANING[status],
            "content": {
                "application/json": {
                    "schema": {
                        "$ref": _ERROR_REF,
                        "properties": {
                            "error": {"properties": {"code": {"enum": sorted(map(str, found))}}}
                        },
                    }
                }
            },
        }
        for status, found in sorted(statuses.items())
    }


def is_error(answer: dict[str, Any]) -> bool:
    """Whether ``answer`` (one of ``responses=``) is an error answer of :func:`errors`."""
    return answer.get("model") is ErrorBody


def codes_in(responses: dict[int | str, dict[str, Any]]) -> list[ErrorCode]:
    """The codes :func:`errors` documented in ``responses`` (its other answers aside)."""
    return [
        error_codes.code_of(code)
        for answer in responses.values()
        if is_error(answer)
        for code in answer["content"]["application/json"]["schema"]["properties"]["error"][
            "properties"
        ]["code"]["enum"]
    ]
