"""Hot statements: declared once as SQLAlchemy Core, run on the driver connection.

A statement on a request's hot path (the goods read, the guarded hold, the order insert) costs
far more CPU in SQLAlchemy's execution layer and its greenlet bridge than in the driver (the
figures are in docs/architecture.md, "How hot statements run"). A :class:`Hot` statement keeps
the schema as the one truth: it is written in Core like every other statement, compiled once per
dialect on first use (SQL text, the order of its parameters, their bind processors, the result
processors of its columns) and then sent straight to the driver connection under the
``AsyncConnection`` that :meth:`dueflow.store.db.Database.write` or ``read`` gave: the same
transaction, the same values (Decimal money, aware UTC datetimes, ints) and the same errors.

A driver error is raised as the SQLAlchemy exception Core would raise for it
(``IntegrityError``, ``DataError``, ``OperationalError``, ...), with the driver's error as its
``orig``, so the transaction's own translation (:func:`dueflow.store.db.translate`) makes it the
same Conflict, Busy or UnstorableValue as before, and code that catches ``IntegrityError`` keeps
working.

Parameters are named ``bindparam`` s in the statement (``goods.c.id == bindparam("goods_id")``);
constants in it (``goods.c.status == "on_sale"``) and scalar column defaults are bound once, at
compile time. IN lists (expanding parameters) and callable defaults are refused there: a hot
statement has one shape.
"""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Column, Table, bindparam, exc, insert
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import Executable

from dueflow.store.types import UTCDateTime

Processor = Callable[[Any], Any] | None


class HotRow(tuple[Any, ...]):
    """A row of a hot statement: a tuple with attribute access and ``_mapping``, like Core's."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))

    if TYPE_CHECKING:  # the columns' attributes are made per statement (_row_class)

        def __getattr__(self, name: str) -> Any: ...


@dataclass
class _Plan:
    """A statement compiled for one dialect."""

    sql: str
    #: Per positional parameter: the caller's name (or None for a constant), the constant.
    slots: tuple[tuple[str | None, Any], ...]
    binders: tuple[Processor, ...]
    returns_rows: bool
    row: type[HotRow] | None
    columns: tuple[Any, ...]
    #: The result processors, known once the driver has described the result.
    readers: tuple[Processor, ...] | None = None
    names: frozenset[str] = field(default_factory=frozenset)


class Hot:
    """One Core statement, run on the driver connection of the current transaction."""

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        self._plans: dict[tuple[str, bool], _Plan] = {}

    async def all(self, conn: AsyncConnection, **params: Any) -> list[HotRow]:
        """Every row the statement returns (a SELECT, or DML with RETURNING)."""
        rows, _ = await self._run(conn, params, want_rows=True)
        return rows

    async def first(self, conn: AsyncConnection, **params: Any) -> HotRow | None:
        """The first row, or None."""
        rows, _ = await self._run(conn, params, want_rows=True)
        return rows[0] if rows else None

    async def scalar(self, conn: AsyncConnection, **params: Any) -> Any:
        """The first column of the first row, or None."""
        rows, _ = await self._run(conn, params, want_rows=True)
        return rows[0][0] if rows else None

    async def rowcount(self, conn: AsyncConnection, **params: Any) -> int:
        """Run an UPDATE, INSERT or DELETE; the rows it matched (a guarded update's verdict)."""
        _, count = await self._run(conn, params, want_rows=False)
        return count

    def plan(self, dialect: Dialect) -> _Plan:
        """The statement compiled for ``dialect`` (built on first use, then kept)."""
        key = (dialect.name, bool(getattr(dialect, "is_mariadb", False)))
        found = self._plans.get(key)
        if found is None:
            found = self._plans[key] = _compile(self.statement, dialect)
        return found

    async def _run(
        self, conn: AsyncConnection, params: Mapping[str, Any], *, want_rows: bool
    ) -> tuple[list[HotRow], int]:
        dialect = conn.dialect
        plan = self.plan(dialect)
        if want_rows and not plan.returns_rows:
            raise TypeError("this hot statement returns no rows; use rowcount()")
        if params.keys() != plan.names:
            raise TypeError(f"hot statement takes {sorted(plan.names)}, got {sorted(params)}")
        args = [
            value if name is None else params[name] if bind is None else bind(params[name])
            for (name, value), bind in zip(plan.slots, plan.binders, strict=True)
        ]
        _announce(conn, plan.sql, args)
        fairy = await _raw(conn)
        try:
            if dialect.name == "postgresql":
                raw, count, types = await _on_asyncpg(fairy, plan, args, want_rows)
            elif dialect.name == "sqlite":
                raw, count, types = await _on_sqlite(fairy.driver_connection, plan, args)
            else:
                raw, count, types = await _on_asyncmy(fairy.driver_connection, plan, args)
        except UnicodeEncodeError:
            raise  # what Core lets through too: Database.write() takes it as UnstorableValue
        except Exception as error:
            raise _wrapped(error, plan.sql, dialect) from error
        if not want_rows:
            return [], count
        if plan.readers is None:
            plan.readers = _readers(plan.columns, dialect, types)
        return [_typed(plan, row) for row in raw], count


class HotInsert:
    """An INSERT of a fixed number of rows of fixed columns (every value a parameter),
    optionally ``RETURNING`` some columns, run hot: the placing transaction's order, line,
    timers and event rows. Callers use it where the dialect has ``INSERT ... RETURNING``
    (``dialect.insert_returning``) when they want rows back; without RETURNING on any."""

    def __init__(
        self, table: Table, columns: tuple[str, ...], rows: int, returning: tuple[Column[Any], ...]
    ) -> None:
        self.columns = columns
        self._names = tuple(
            tuple((f"r{index}_{name}", name) for name in columns) for index in range(rows)
        )
        values = [
            {name: bindparam(param, type_=table.c[name].type) for param, name in names}
            for names in self._names
        ]
        statement = insert(table).values(values if rows > 1 else values[0])
        self.hot = Hot(statement.returning(*returning) if returning else statement)

    def params(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The statement's parameters for ``rows`` (dicts holding at least its columns)."""
        if len(rows) != len(self._names):
            raise TypeError(f"this insert takes {len(self._names)} rows, got {len(rows)}")
        return {
            param: row[name]
            for names, row in zip(self._names, rows, strict=True)
            for param, name in names
        }

    async def all(self, conn: AsyncConnection, rows: Sequence[Mapping[str, Any]]) -> list[HotRow]:
        """Insert ``rows``; the rows RETURNING gives back."""
        return await self.hot.all(conn, **self.params(rows))

    async def rowcount(self, conn: AsyncConnection, rows: Sequence[Mapping[str, Any]]) -> int:
        """Insert ``rows``; how many were inserted."""
        return await self.hot.rowcount(conn, **self.params(rows))


_INSERTS: dict[tuple[str, tuple[str, ...], int, tuple[str, ...]], HotInsert] = {}


def inserting(
    table: Table,
    columns: Sequence[str],
    rows: int = 1,
    returning: tuple[Column[Any], ...] = (),
) -> HotInsert:
    """The :class:`HotInsert` of ``rows`` rows of ``table`` writing ``columns`` (built once
    for each shape, then kept: a few shapes exist)."""
    key = (table.name, tuple(columns), rows, tuple(column.key for column in returning))
    found = _INSERTS.get(key)
    if found is None:
        found = _INSERTS[key] = HotInsert(table, tuple(columns), rows, returning)
    return found


async def _raw(conn: AsyncConnection) -> Any:
    """The pooled (driver) connection under ``conn``. ``get_raw_connection`` crosses into a
    greenlet on every call (measured: 4% of a place's CPU over its seven hot statements); the
    connection in hand is read directly, and only one SQLAlchemy must first revalidate (after
    an invalidation) takes that way."""
    sync = conn.sync_connection
    fairy = None if sync is None or sync.invalidated else sync._dbapi_connection
    if fairy is None:
        return await conn.get_raw_connection()
    return fairy


def _announce(conn: AsyncConnection, sql: str, args: list[Any]) -> None:
    """Tell the engine's ``before_cursor_execute`` listeners of the statement, as Core does
    (with no cursor and no execution context): what counts statements (the
    ``dueflow_db_statements_total`` metric, the statement-count tests) sees hot ones too."""
    sync = conn.sync_connection
    if sync is not None:
        for listener in sync.dispatch.before_cursor_execute:
            listener(sync, None, sql, args, None, False)


def _typed(plan: _Plan, row: Sequence[Any]) -> HotRow:
    assert plan.row is not None and plan.readers is not None
    return plan.row(
        value if read is None or value is None else read(value)
        for value, read in zip(row, plan.readers, strict=True)
    )


async def _on_asyncpg(
    fairy: Any, plan: _Plan, args: list[Any], want_rows: bool
) -> tuple[Sequence[Any], int, Sequence[Any] | None]:
    driver = fairy.driver_connection
    if not driver.is_in_transaction():
        # SQLAlchemy's asyncpg adapter sends BEGIN with the first statement it runs; a hot
        # statement that comes first must start that same transaction, or it would autocommit.
        await fairy.dbapi_connection._start_transaction()
        if not driver.is_in_transaction():
            raise RuntimeError("a hot statement needs the transaction of Database.write/read")
    if not want_rows:
        status = await driver.execute(plan.sql, *args)
        return (), int(status.rsplit(" ", 1)[-1]), None
    types = None
    if plan.readers is None:
        prepared = await driver.prepare(plan.sql)
        types = [attribute.type.oid for attribute in prepared.get_attributes()]
    rows = await driver.fetch(plan.sql, *args)
    return rows, len(rows), types


async def _on_asyncmy(driver: Any, plan: _Plan, args: list[Any]) -> tuple[Any, int, Any]:
    cursor = driver.cursor()
    try:
        await cursor.execute(plan.sql, args)
        rows = await cursor.fetchall() if plan.returns_rows else ()
        return rows, cursor.rowcount, _coltypes(cursor.description)
    finally:
        await cursor.close()


async def _on_sqlite(driver: Any, plan: _Plan, args: list[Any]) -> tuple[Any, int, Any]:
    """The inline connection (sqlite_inline) or aiosqlite's: the same asyncio interface."""
    cursor = await driver.execute(plan.sql, args)
    try:
        rows = await cursor.fetchall() if plan.returns_rows else ()
        count = len(rows) if plan.returns_rows else cursor.rowcount
        return rows, count, _coltypes(cursor.description)
    finally:
        await cursor.close()


def _coltypes(description: Any) -> list[Any] | None:
    return None if description is None else [entry[1] for entry in description]


def _compile(statement: Executable, dialect: Dialect) -> _Plan:
    compiled: Any = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
    defaults = {
        column.key: column.default
        for column in (*compiled.insert_prefetch, *compiled.update_prefetch)
    }
    slots: list[tuple[str | None, Any]] = []
    binders: list[Processor] = []
    for name in compiled.positiontup or ():
        bind = compiled.binds[name]
        if bind.expanding:
            raise ValueError(f"hot statements take no IN lists ({name})")
        process = _remembering(
            bind.type, dialect, bind.type.dialect_impl(dialect).bind_processor(dialect)
        )
        if name in defaults:
            default = defaults[name]
            if default is None or not default.is_scalar:
                raise ValueError(f"hot statements take only scalar defaults ({name})")
            value = default.arg
        elif bind.required:
            slots.append((bind.key, None))
            binders.append(process)
            continue
        else:
            value = bind.effective_value
        slots.append((None, process(value) if process and value is not None else value))
        binders.append(None)
    columns: tuple[Any, ...] = ()
    if getattr(statement, "is_select", False):
        columns = tuple(getattr(statement, "selected_columns", ()))
    elif compiled.effective_returning:
        columns = tuple(compiled.effective_returning)
    returns_rows = bool(columns)
    row = _row_class(tuple(column.key for column in columns)) if returns_rows else None
    return _Plan(
        sql=compiled.string,
        slots=tuple(slots),
        binders=tuple(binders),
        returns_rows=returns_rows,
        row=row,
        columns=columns,
        names=frozenset(name for name, _ in slots if name is not None),
    )


def _remembering(type_: Any, dialect: Dialect, process: Processor) -> Processor:
    """``process``, answering again at once for the datetime object of the last call by any
    :class:`~dueflow.store.types.UTCDateTime` bind of the same dialect: a placing transaction
    binds one ``now`` to six columns and one pay deadline to three over its statements, each a
    conversion to text on SQLite (measured: ~3% of a place's CPU went to datetime binds).
    UTCDateTime only: it takes no arguments, so it converts one way on a dialect (a type with
    arguments or variants could convert two ways), and datetimes are immutable, so the same
    object is the same value."""
    if process is None or type(type_) is not UTCDateTime:
        return process
    kind = (dialect.name, _mariadb(dialect))
    last = _LAST_BOUND.setdefault(kind, [(None, None)])
    convert = process

    def remembered(value: Any) -> Any:
        # One (value, converted) pair, replaced whole: a reader never sees halves of two calls.
        seen, converted = last[0]
        if value is seen and value is not None:
            return converted
        converted = convert(value)
        last[0] = (value, converted)
        return converted

    return remembered


#: Per dialect: the last UTCDateTime bound and what it became.
_LAST_BOUND: dict[tuple[Any, ...], list[tuple[Any, Any]]] = {}


def _mariadb(dialect: Dialect) -> bool:
    return bool(getattr(dialect, "is_mariadb", False))


def _row_class(keys: tuple[str, ...]) -> type[HotRow]:
    """A HotRow class whose attributes are these column keys."""
    attributes: dict[str, Any] = {"__slots__": (), "_fields": keys}
    for index, key in enumerate(keys):
        attributes[key] = property(operator.itemgetter(index))
    return type("HotRow", (HotRow,), attributes)


def _readers(
    columns: Sequence[Any], dialect: Dialect, types: Sequence[Any] | None
) -> tuple[Processor, ...]:
    coltypes = list(types) if types is not None else [None] * len(columns)
    return tuple(
        column.type.dialect_impl(dialect).result_processor(dialect, coltype)
        for column, coltype in zip(columns, coltypes, strict=True)
    )


def _wrapped(error: Exception, sql: str, dialect: Dialect) -> Exception:
    """The SQLAlchemy exception Core raises for this driver error (its class by the DB-API
    name of the driver's, or by SQLSTATE class for asyncpg, whose classes have other names)."""
    state = str(getattr(error, "sqlstate", "") or "")
    kind: type[exc.DBAPIError]
    if dialect.name == "postgresql":
        if state.startswith("23"):
            kind = exc.IntegrityError
        elif state.startswith("22"):
            kind = exc.DataError
        elif state:
            kind = exc.OperationalError
        else:
            kind = exc.InterfaceError
        return kind(sql, None, error)
    base = sqlite3.Error if dialect.name == "sqlite" else dialect.loaded_dbapi.Error
    if not isinstance(error, base):  # the connection itself failed (a reset socket)
        return exc.InterfaceError(sql, None, error)
    return exc.DBAPIError.instance(sql, None, error, base)
