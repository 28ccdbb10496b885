"""The order event tables: the events, their sequence and the webhook delivery streams."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, ForeignKey, Index, Integer, String, Table, Text, text

from dueflow.store._schema_base import metadata, table_with_id, timestamps
from dueflow.store.types import Id, UTCDateTime

order_events = table_with_id(
    "order_events",
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False, index=True),
    Column("at", UTCDateTime, nullable=False),
    Column("event", String(32), nullable=False),
    Column("actor", String(64), nullable=False),
    Column("from_status", String(32)),
    Column("to_status", String(32)),
    Column("detail", String(500)),
    # What is particular to the event (JSON, written with it: docs/events.md's type table) and
    # the order as its view shows it after the event's transaction (JSON; store/snapshots.py).
    # NULL on events written before migration 0014.
    Column("data", Text),
    Column("snapshot", Text),
    # The order in which events became visible, numbered after they commit by the sequencer
    # (store/events.py); NULL until then. Ids are not that order: a slower transaction with a
    # lower id can commit later. The unique index also finds the rows still to number.
    Column("seq", BigInteger),
    # The W3C traceparent of the span that wrote it (its webhook deliveries link there); NULL
    # while tracing is off (dueflow/tracing.py).
    Column("trace_parent", String(55)),
    Index("ix_order_events_seq", "seq", unique=True),
    # One user's feed: the events of that user's orders, in seq order, one range per order.
    Index("ix_order_events_order_id_seq", "order_id", "seq"),
)

#: One row (id 1): the last sequence number given to an order event.
event_sequence = Table(
    "event_sequence",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("last_seq", BigInteger, nullable=False),
)

#: Where each webhook delivery stream stands: each endpoint's live stream (name "live" for the
#: settings' endpoint, "endpoint-<id>" for the others; its lease says which process delivers to
#: that endpoint) and operators' replays of one event or a range to one endpoint.
event_deliveries = table_with_id(
    "event_deliveries",
    Column("name", String(40), nullable=False, unique=True),
    # The API-made endpoint (webhook_endpoints.id) the stream delivers to; NULL: the endpoint
    # of the settings (DUEFLOW_EVENTS_WEBHOOK_URL), whose live stream is named "live".
    Column("endpoint_id", Id),
    # Every event up to this seq has been delivered (a replay starts one before its first).
    Column("delivered_seq", BigInteger, nullable=False),
    Column("until_seq", BigInteger),  # a replay's last event; NULL for the live stream
    # Failed tries of the next event in a row, and the last one's error.
    Column("failures", Integer, nullable=False, default=0, server_default=text("0")),
    Column("last_error", Text),
    Column("last_error_at", UTCDateTime),
    Column("retry_at", UTCDateTime),
    Column("owner", String(64)),
    Column("lease_until", UTCDateTime),
    Column("requested_by", String(64)),
    *timestamps(),
    Column("done_at", UTCDateTime),
)
