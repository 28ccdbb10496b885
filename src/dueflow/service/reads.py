"""Reads that do not depend on each other, run side by side on PostgreSQL and MariaDB: dealt to
a few pooled connections, so a page waits for the longest share, not for the sum of them.

The dashboard and ``dueflow status`` read a dozen counts and lists, each a few milliseconds; one
after the other on one connection, their round trips and the database's work added up (the sum
was most of the dashboard's time over a million orders: docs/benchmarks.md). Side by side they
overlap. At most :data:`WIDTH` of a page's reads hold a connection at once (the ``lanes`` the
page passes to each call), so a page takes a few of the pool's 15 connections and leaves the
rest to the order paths.

On SQLite the reads run one after the other on one connection, as before: it has one file and
its report connections are threads of one process.

Every read is a statement of its own under READ COMMITTED on every database (each sees what
was committed when it started), on one connection or on several: reading them side by side
changes no count's meaning.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.service.deps import Deps

T = TypeVar("T")

#: How many reads of one page hold a connection at once (of the pool's 15:
#: store/_db_connect.py), unless it says otherwise.
WIDTH = 3

#: A read on a connection it is given.
Part = Callable[[AsyncConnection], Awaitable[Any]]


def side_by_side(deps: Deps) -> bool:
    """Whether reads of ``deps``' database run on connections of their own at once (not on
    SQLite)."""
    return deps.db.dialect != "sqlite"


def lanes(width: int = WIDTH) -> asyncio.Semaphore:
    """What bounds the connections of one page's reads: pass it to every :func:`each` and
    :func:`together` of that page (made in the running loop)."""
    return asyncio.Semaphore(width)


async def each(
    deps: Deps, parts: Sequence[Part], *, lanes: asyncio.Semaphore | None = None
) -> list[Any]:
    """The results of ``parts``, in their order: on PostgreSQL and MariaDB dealt round-robin
    to :data:`WIDTH` connections, each running its share one after the other in one read
    transaction, the connections side by side as far as ``lanes`` lets; on SQLite all on one
    connection. (A transaction costs two round trips, BEGIN and ROLLBACK, each a wake-up of
    the database's process on a loaded machine: one per part made the dashboard's 30 reads 110
    round trips.)"""
    if not side_by_side(deps):
        async with deps.db.report() as conn:
            return [await part(conn) for part in parts]
    bound = lanes or asyncio.Semaphore(WIDTH)
    shares = [range(first, len(parts), WIDTH) for first in range(min(WIDTH, len(parts)))]
    found: list[Any] = [None] * len(parts)

    async def on_one_connection(share: range) -> None:
        async with bound, deps.db.report() as conn:
            for index in share:
                found[index] = await parts[index](conn)

    await asyncio.gather(*(on_one_connection(share) for share in shares))
    return found


async def together(
    deps: Deps, *calls: Callable[[], Awaitable[Any]], lanes: asyncio.Semaphore | None = None
) -> list[Any]:
    """The results of ``calls`` (each a read holding one connection at a time), in their
    order: as many at once as ``lanes`` lets on PostgreSQL and MariaDB, one after the other
    on SQLite."""
    if not side_by_side(deps):
        return [await call() for call in calls]
    bound = lanes or asyncio.Semaphore(WIDTH)

    async def in_a_lane(call: Callable[[], Awaitable[Any]]) -> Any:
        async with bound:
            return await call()

    return list(await asyncio.gather(*(in_a_lane(call) for call in calls)))
