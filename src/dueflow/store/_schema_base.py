"""What every table shares: the metadata (its naming convention), the key most tables have and
the times most rows keep."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, MetaData, Table
from sqlalchemy.schema import SchemaItem

from dueflow.store.types import Id, UTCDateTime

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
    }
)


def table_with_id(name: str, *items: SchemaItem) -> Table:
    """Table ``name`` of :data:`metadata`, keyed by its own ``id`` (numbered by the database)
    and then holding ``items``, its columns, constraints and indexes."""
    return Table(name, metadata, Column("id", Id, primary_key=True, autoincrement=True), *items)


def timestamps() -> tuple[Column[datetime], Column[datetime]]:
    """``created_at`` and ``updated_at``: when the row was written first and last."""
    return (
        Column("created_at", UTCDateTime, nullable=False),
        Column("updated_at", UTCDateTime, nullable=False),
    )
