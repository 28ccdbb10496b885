"""The operators' order list (``/admin/orders`` and its CSV): every order, newest first, kept to
filters (status, flow, buyer, seller, placed between two times) and to what a search text names
(an order id, a payment's ``pay_no``, a refund's ``refund_no`` or a ticket's code), with the
buyer's and the seller's names joined in.

A page is one statement, keyset on id as in :mod:`dueflow.store.lists`: ``WHERE <filters> AND
id < :after ORDER BY id DESC LIMIT :limit + 1``; kept to a span of placing times, keyset on
(created_at, id) instead (:func:`page_query`). A search is a semi-join on the ids its four
lookups find, each one probe of a unique index (``orders`` primary key, ``uq_payments_pay_no``,
``uq_refunds_refund_no``, ``uq_tickets_code``), so a search costs a few index probes whatever
the table's size. Which index serves the filters is the database's choice; docs/admin.md
("Orders to find: the reads") has the plans on PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Row,
    ScalarSelect,
    Select,
    literal,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import UnaryExpression

from dueflow.store.schema import orders, payments, refunds, tickets, users

#: Who is meant: a user's id, or (text) a user's name.
Person = int | str


@dataclass(frozen=True)
class OrderFilter:
    """What the list is kept to; None (or empty) keeps nothing out.

    ``placed_from`` is inclusive and ``placed_before`` exclusive; ``search`` is matched exactly
    against an order id, a pay_no, a refund_no and a ticket code (whichever it is).
    """

    status: str | None = None
    flow: str | None = None
    buyer: Person | None = None
    seller: Person | None = None
    placed_from: datetime | None = None
    placed_before: datetime | None = None
    search: str | None = None


_buyers = users.alias("buyers")
_sellers = users.alias("sellers")

#: What a row of the list holds.
COLUMNS = (
    orders.c.id,
    orders.c.status,
    orders.c.flow,
    orders.c.order_type,
    orders.c.amount,
    orders.c.created_at,
    orders.c.buyer_id,
    _buyers.c.name.label("buyer"),
    orders.c.seller_id,
    _sellers.c.name.label("seller"),
)

_LISTED = select(*COLUMNS).select_from(
    orders.join(_buyers, _buyers.c.id == orders.c.buyer_id).join(
        _sellers, _sellers.c.id == orders.c.seller_id
    )
)

#: The largest id a search text may name (ids are positive 64-bit integers).
_MAX_ID = 2**63 - 1


def _person(person: Person) -> int | ScalarSelect[Any]:
    """A user id, or the id of the user of that name (a subquery: no statement of its own)."""
    if isinstance(person, int):
        return person
    return select(users.c.id).where(users.c.name == person).scalar_subquery()


def named_by(text: str) -> Select[Any]:
    """The ids of the orders ``text`` names, with what named each (``order``, ``payment``,
    ``refund``, ``ticket``): one probe of a unique index each."""
    found = [
        select(payments.c.order_id, literal("payment").label("by")).where(
            payments.c.pay_no == text
        ),
        select(refunds.c.order_id, literal("refund").label("by")).where(
            refunds.c.refund_no == text
        ),
        select(tickets.c.order_id, literal("ticket").label("by")).where(tickets.c.code == text),
    ]
    number = text.lstrip("#")
    if number.isascii() and number.isdigit() and 1 <= int(number) <= _MAX_ID:
        found.insert(
            0,
            select(orders.c.id.label("order_id"), literal("order").label("by")).where(
                orders.c.id == int(number)
            ),
        )
    return union_all(*found)  # type: ignore[return-value]


def where(kept: OrderFilter) -> list[ColumnElement[bool]]:
    """The conditions of ``kept`` on ``orders``."""
    conditions: list[ColumnElement[bool]] = []
    if kept.status is not None:
        conditions.append(orders.c.status == kept.status)
    if kept.flow is not None:
        conditions.append(orders.c.flow == kept.flow)
    if kept.buyer is not None:
        conditions.append(orders.c.buyer_id == _person(kept.buyer))
    if kept.seller is not None:
        conditions.append(orders.c.seller_id == _person(kept.seller))
    if kept.placed_from is not None:
        conditions.append(orders.c.created_at >= kept.placed_from)
    if kept.placed_before is not None:
        conditions.append(orders.c.created_at < kept.placed_before)
    if kept.search:
        ids = named_by(kept.search).subquery()
        conditions.append(orders.c.id.in_(select(ids.c.order_id)))
    return conditions


def by_time(kept: OrderFilter) -> bool:
    """Whether the list is kept to a span of placing times, and so read in placing order."""
    return kept.placed_from is not None or kept.placed_before is not None


def page_query(kept: OrderFilter, *, after: int | None, limit: int) -> Select[Any]:
    """The statement of one page: up to ``limit`` + 1 orders kept by ``kept`` after the order
    ``after``, newest first, each with its buyer's and seller's names.

    Newest first is by id, but by placing time (then id) when ``kept`` names a span of times:
    a span long past is then one backward range read of (created_at, id), where by id the
    database would read back from the newest order through every later one (ids follow placing
    times only roughly, so no id bound could stand in for the span)."""
    conditions = where(kept)
    if by_time(kept):
        if after is not None:
            at = select(orders.c.created_at).where(orders.c.id == after).scalar_subquery()
            # The row comparison is the keyset; ``created_at <= at`` beside it bounds the range
            # read on MariaDB, whose range optimizer leaves row comparisons out.
            conditions.append(orders.c.created_at <= at)
            conditions.append(tuple_(orders.c.created_at, orders.c.id) < tuple_(at, after))
        order: tuple[UnaryExpression[Any], ...] = (orders.c.created_at.desc(), orders.c.id.desc())
    else:
        if after is not None:
            conditions.append(orders.c.id < after)
        order = (orders.c.id.desc(),)
    return _LISTED.where(*conditions).order_by(*order).limit(limit + 1)


async def orders_page(
    conn: AsyncConnection, kept: OrderFilter, *, after: int | None, limit: int
) -> list[Row[Any]]:
    """Up to ``limit`` + 1 orders kept by ``kept`` below id ``after``, newest first (the extra
    row only says another page follows). One statement."""
    return list((await conn.execute(page_query(kept, after=after, limit=limit))).all())
