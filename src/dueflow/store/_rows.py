"""One row added (the INSERT every store module's ``insert_*`` runs) and one row read, locked or
not (the ``get``-by-key reads' ``for_update``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Row, Select, Table, insert
from sqlalchemy.ext.asyncio import AsyncConnection


async def add(conn: AsyncConnection, table: Table, row: Mapping[str, Any], /, **more: Any) -> int:
    """Insert one row of ``table`` with the columns of ``row`` and ``more`` (one statement, its
    columns in the table's order whatever the order given); returns the new row's id."""
    result = await conn.execute(insert(table).values({**row, **more}))
    return int(result.inserted_primary_key[0])  # type: ignore[index]


async def first(
    conn: AsyncConnection, query: Select[Any], *, for_update: bool = False
) -> Row[Any] | None:
    """The first row ``query`` reads (None when none), locked until the transaction ends
    (``SELECT ... FOR UPDATE``) when ``for_update``."""
    if for_update:
        query = query.with_for_update()
    row: Row[Any] | None = (await conn.execute(query)).first()
    return row
