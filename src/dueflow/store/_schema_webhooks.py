"""The webhook endpoints made over the API (each with its delivery streams in
``event_deliveries``, by ``endpoint_id``)."""

from __future__ import annotations

from sqlalchemy import Boolean, Column, String, true

from dueflow.store._schema_base import table_with_id, timestamps
from dueflow.store.types import UTCDateTime

webhook_endpoints = table_with_id(
    "webhook_endpoints",
    Column("url", String(2000), nullable=False),
    # ``whsec_`` secrets, kept as given: they sign every send, so they cannot be stored hashed.
    # The API shows one only when it is made (creation, rotation).
    Column("secret", String(100), nullable=False),
    # After a rotation the old secret signs too until ``previous_until`` (receivers move over).
    Column("previous_secret", String(100)),
    Column("previous_until", UTCDateTime),
    # The event types sent, space-separated; NULL: every event.
    Column("event_types", String(1000)),
    Column("enabled", Boolean, nullable=False, server_default=true()),
    Column("description", String(200)),
    Column("created_by", String(64), nullable=False),
    *timestamps(),
)
