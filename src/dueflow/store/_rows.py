"""Adding one row and getting its id: the one INSERT every store module's ``insert_*`` runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Table, insert
from sqlalchemy.ext.asyncio import AsyncConnection


async def add(conn: AsyncConnection, table: Table, row: Mapping[str, Any], /, **more: Any) -> int:
    """Insert one row of ``table`` with the columns of ``row`` and ``more`` (one statement, its
    columns in the table's order whatever the order given); returns the new row's id."""
    result = await conn.execute(insert(table).values({**row, **more}))
    return int(result.inserted_primary_key[0])  # type: ignore[index]
