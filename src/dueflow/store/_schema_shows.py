"""The show tables: shows, seats, seat holds, per-buyer counts, tickets."""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    UniqueConstraint,
)

from dueflow.store._schema_base import metadata, table_with_id, timestamps
from dueflow.store.types import Id, Money, UTCDateTime

shows = table_with_id(
    "shows",
    Column("organizer_id", Id, ForeignKey("users.id"), nullable=False),
    Column("title", String(200), nullable=False),
    Column("venue", String(200), nullable=False),
    Column("starts_at", UTCDateTime, nullable=False),
    Column("sales_close_at", UTCDateTime, nullable=False),
    Column("seat_limit", Integer, nullable=False),  # seats one buyer may hold or buy
    Column("status", String(16), nullable=False),  # on_sale | cancelled
    Column("cancelled_at", UTCDateTime),
    *timestamps(),
    Index("ix_shows_organizer_id_id", "organizer_id", "id"),
    # The shows list (store/lists.py) in one status, newest first.
    Index("ix_shows_status_id", "status", "id"),
)

seats = table_with_id(
    "seats",
    Column("show_id", Id, ForeignKey("shows.id"), nullable=False),
    Column("label", String(16), nullable=False),
    Column("section", String(8), nullable=False),
    Column("row", String(8)),
    Column("number", Integer, nullable=False),
    Column("tier", String(16), nullable=False),  # the price tier (the section by default)
    Column("price", Money, nullable=False),
    UniqueConstraint("show_id", "label"),
)

#: Live seat holds and sales: a row per seat held by a live unpaid order or sold to a paid one,
#: deleted when the order lets the seat go. The unique key is the promise that no seat is held
#: or sold twice, whatever any cache says.
seat_holds = table_with_id(
    "seat_holds",
    Column("show_id", Id, ForeignKey("shows.id"), nullable=False),
    Column("seat_id", Id, ForeignKey("seats.id"), nullable=False),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    Column("buyer_id", Id, ForeignKey("users.id"), nullable=False),
    Column("state", String(8), nullable=False),  # held | sold
    *timestamps(),
    UniqueConstraint("show_id", "seat_id"),
)

#: Seats each buyer holds or bought for a show: the per-buyer limit is one guarded update of
#: this row inside the placing transaction, so two parallel orders cannot both pass it.
show_buyers = Table(
    "show_buyers",
    metadata,
    Column("show_id", Id, ForeignKey("shows.id"), primary_key=True, autoincrement=False),
    Column("buyer_id", Id, ForeignKey("users.id"), primary_key=True, autoincrement=False),
    Column("seats", Integer, nullable=False),
    CheckConstraint("seats >= 0", name="seats_not_negative"),
)

#: One ticket per seat of a paid order, its code unguessable; void once the show is cancelled.
#: Checked in once at the door (service/checkin.py): when, at which gate, by whom (an actor).
tickets = table_with_id(
    "tickets",
    Column("code", String(32), nullable=False, unique=True),
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    Column("show_id", Id, ForeignKey("shows.id"), nullable=False),
    Column("seat_id", Id, ForeignKey("seats.id"), nullable=False),
    Column("state", String(8), nullable=False),  # valid | void
    Column("created_at", UTCDateTime, nullable=False),
    Column("voided_at", UTCDateTime),
    Column("checked_in_at", UTCDateTime),
    Column("checked_in_gate", String(40)),
    Column("checked_in_by", String(64)),
    # A show's tickets in seat order: the CSV export and the gate's counts.
    Index("ix_tickets_show_id_seat_id", "show_id", "seat_id"),
)
