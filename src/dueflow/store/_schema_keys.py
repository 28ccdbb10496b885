"""The service keys a host application's back end calls with (``Authorization: Bearer dfk_...``).

A key's secret is stored only as its SHA-256 (a secret of 32 random bytes needs no slow hash: a
hash that leaked cannot be turned back into it), and looked up by that hash. Rotating a key makes
a new row, ``rotated_from`` the old one, with the same name, scopes and expiry: both secrets work
until the old row is revoked."""

from __future__ import annotations

from sqlalchemy import Column, ForeignKey, String

from dueflow.store._schema_base import table_with_id
from dueflow.store.types import Id, UTCDateTime

api_keys = table_with_id(
    "api_keys",
    Column("name", String(64), nullable=False),
    # The public start of the secret (``dfk_live_ab12cd``), shown in lists to tell keys apart.
    Column("prefix", String(32), nullable=False),
    Column("secret_hash", String(64), nullable=False, unique=True),
    # Space-separated, from service/keys.py's SCOPES.
    Column("scopes", String(255), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    # Who made it, as an actor string (``user:5``, ``user:5@key:2``, ``cli``).
    Column("created_by", String(64), nullable=False),
    Column("expires_at", UTCDateTime, nullable=True),
    Column("revoked_at", UTCDateTime, nullable=True),
    Column("rotated_from", Id, ForeignKey("api_keys.id"), nullable=True),
)
