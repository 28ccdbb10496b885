"""Counter rows: counting against a limit (a buyer's seats of a show, units of a flash sale),
and adding a different amount to many rows at once (units back to stock, seats and units no
longer counted against their buyers), in few statements, with the locks taken in key order.

A cancel gives back units of many SKUs and counts of many buyers in one transaction. One UPDATE
per row would cost a round trip each; one UPDATE for all needs each row's own amount. So rows are
grouped by amount (one UPDATE ``... WHERE key IN (...)`` per distinct amount, when there are few:
a herd's buyers each give back one or two), else updated through a ``CASE`` on the key in chunks
(a quadratic ``CASE`` stays small). The sums are exact either way: every row is in one group.

Counter rows are shared by transactions (two workers' cancels, a placement taking a SKU in id
order): a set-based UPDATE locks rows in whatever order its plan meets them, so on PostgreSQL and
MySQL the rows are first locked by one ``SELECT ... ORDER BY key FOR UPDATE``; every transaction
then takes them in key order, and no two wait on each other in a cycle. SQLite has one writer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from sqlalchemy import (
    BigInteger,
    Column,
    String,
    Table,
    and_,
    any_,
    bindparam,
    case,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import Executable

from dueflow.store import hot

#: Up to this many distinct amounts, one UPDATE per amount; beyond, CASE chunks.
FEW_AMOUNTS = 4
#: Keys per CASE (its cost grows with keys times rows).
CASE_CHUNK = 200

Key = tuple[int, ...]
#: The values an UPDATE sets, given the amount (a number or a SQL expression).
Values = Callable[[Any], Mapping[str, Any]]


async def add_each(
    conn: AsyncConnection,
    table: Table,
    key: Sequence[Column[Any]],
    amounts: Mapping[Key, int],
    values: Values,
) -> None:
    """Apply ``values(amount)`` to each row whose ``key`` columns equal a key of ``amounts``,
    with that key's amount. Keys are tuples of the key columns' values (a 1-tuple for an id);
    all but the last column of a composite key group the rows (the show, the flash sale)."""
    if not amounts:
        return
    groups: dict[Key, dict[int, int]] = defaultdict(dict)
    for k, amount in amounts.items():
        groups[k[:-1]][k[-1]] = amount
    lead, last = key[:-1], key[-1]

    def within(prefix: Key, members: Sequence[int]) -> Any:
        return and_(*(c == v for c, v in zip(lead, prefix, strict=True)), last.in_(members))

    if len(amounts) > 1 and conn.dialect.name != "sqlite":
        everything = or_(*(within(prefix, sorted(m)) for prefix, m in sorted(groups.items())))
        await conn.execute(select(*key).where(everything).order_by(*key).with_for_update())
    for prefix, members in sorted(groups.items()):
        by_amount: dict[int, list[int]] = defaultdict(list)
        for member, amount in sorted(members.items()):
            by_amount[amount].append(member)
        if len(by_amount) <= FEW_AMOUNTS:
            for amount, ks in sorted(by_amount.items()):
                await conn.execute(update(table).where(within(prefix, ks)).values(**values(amount)))
            continue
        ordered = sorted(members)
        for start in range(0, len(ordered), CASE_CHUNK):
            chunk = ordered[start : start + CASE_CHUNK]
            amount_of = case({member: members[member] for member in chunk}, value=last)
            await conn.execute(
                update(table).where(within(prefix, chunk)).values(**values(amount_of))
            )


def among(conn: AsyncConnection, column: Column[Any], ids: Sequence[int]) -> Any:
    """``column IN (ids)`` for a batch's ids. On PostgreSQL ``column = ANY(:ids)``, one array
    parameter: an IN list of 2,000 ids is 2,000 parameters rendered into the statement on every
    execution (a quarter of a herd's worker time went there), and each length is a statement of
    its own for the driver's cache. On SQLite likewise one parameter, a JSON array read by
    ``json_each`` (rendering the IN lists was a tenth of the SQLite herd's worker time).
    Elsewhere a plain IN list."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        return column == any_(bindparam(None, list(ids), type_=ARRAY(BigInteger)))
    if dialect == "sqlite":
        listed = bindparam(None, orjson.dumps(list(ids)).decode(), type_=String)
        return column.in_(select(func.json_each(listed).table_valued("value").c.value))
    return column.in_(ids)


def listed(dialect: str, column: Column[Any], name: str) -> Any:
    """:func:`among` with the ids as the named parameter ``name`` (its value from
    :func:`ids_value`), for a statement built once; None where the dialect has no one-parameter
    id list (MySQL: the caller uses :func:`among`)."""
    if dialect == "postgresql":
        return column == any_(bindparam(name, type_=ARRAY(BigInteger)))
    if dialect == "sqlite":
        listed = bindparam(name, type_=String)
        return column.in_(select(func.json_each(listed).table_valued("value").c.value))
    return None


def ids_value(dialect: str, ids: Sequence[int]) -> Any:
    """The value of a :func:`listed` parameter: a list (PostgreSQL's array), JSON text
    (SQLite's ``json_each``)."""
    return orjson.dumps(list(ids)).decode() if dialect == "sqlite" else list(ids)


class HotAmong:
    """A batch statement over one id list (``column IN ids``), built and compiled once per
    dialect as a :class:`~dueflow.store.hot.Hot` statement: on PostgreSQL and SQLite the list
    is one parameter (:func:`listed`), so the statement has one shape whatever the batch. A
    herd's batches ran the same few selects thousands of times, and SQLAlchemy's execution
    layer (its cache key, compiled-cache look-up, result set up) cost more than SQLite's reads.
    ``make`` gives the statement given the id test for a column; :meth:`on` is None on MySQL,
    where the caller runs its statement with :func:`among` as before."""

    def __init__(self, make: Callable[[Callable[[Column[Any]], Any]], Executable]) -> None:
        self.make = make
        self._by_dialect: dict[str, hot.Hot] = {}

    def on(self, conn: AsyncConnection) -> hot.Hot | None:
        """The Hot statement for ``conn``'s dialect (parameter ``ids``), or None (MySQL)."""
        dialect = conn.dialect.name
        found = self._by_dialect.get(dialect)
        if found is None:
            if dialect not in ("postgresql", "sqlite"):
                return None
            statement = self.make(lambda column: listed(dialect, column, "ids"))
            found = self._by_dialect[dialect] = hot.Hot(statement)
        return found

    async def all(self, conn: AsyncConnection, ids: Sequence[int]) -> list[Any] | None:
        """The rows for ``ids``, or None on MySQL (the caller runs the statement itself)."""
        statement = self.on(conn)
        if statement is None:
            return None
        return list(await statement.all(conn, ids=ids_value(conn.dialect.name, ids)))


async def count_against(
    conn: AsyncConnection,
    table: Table,
    key: Mapping[str, int],
    column: str,
    more: int,
    limit: int,
) -> int | None:
    """Count ``more`` against ``limit`` in the ``column`` of the row of ``table`` at ``key``
    (its key columns' values): the row is inserted counting 0 unless it exists, then one
    guarded update adds ``more`` if the count stays within ``limit``; the row stays locked until
    the transaction ends, so two parallel orders of one buyer are counted one after the other.
    Returns None when counted, else the row's count (what the buyer already holds or bought)."""
    await conn.execute(_insert_unless_exists(conn, table, key, column))
    count = table.c[column]
    mine = and_(*(table.c[name] == value for name, value in key.items()))
    result = await conn.execute(
        update(table).where(mine, count + more <= limit).values({column: count + more})
    )
    if result.rowcount == 1:
        return None
    return int(await conn.scalar(select(count).where(mine)) or 0)


async def uncount(
    conn: AsyncConnection,
    table: Table,
    key: Sequence[str],
    column: str,
    amounts: Mapping[Key, int],
) -> None:
    """Take each key's amount back off the count in ``column`` of the rows of ``table`` (what
    :func:`count_against` counted), set-based: :func:`add_each` on the ``key`` columns."""
    count = table.c[column]
    columns = [table.c[name] for name in key]
    await add_each(conn, table, columns, amounts, lambda n: {column: count - n})


def _insert_unless_exists(
    conn: AsyncConnection, table: Table, key: Mapping[str, int], column: str
) -> Any:
    """Insert the counter row (``column`` 0) unless it exists. MySQL's INSERT IGNORE would take
    a shared lock on an existing row, which two parallel orders then both try to upgrade for
    the guarded update (a deadlock): there a no-op ON DUPLICATE KEY UPDATE locks it exclusively
    at once. PostgreSQL's ON CONFLICT DO NOTHING takes no lock; the update then queues."""
    values = {**key, column: 0}
    dialect = conn.dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table).values(**values).on_conflict_do_nothing()
    if dialect == "sqlite":
        return sqlite.insert(table).values(**values).on_conflict_do_nothing()
    statement = mysql.insert(table).values(**values)
    return statement.on_duplicate_key_update({column: table.c[column]})
