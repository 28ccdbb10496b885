"""What the timer statements share: the states as SQL literals, the timer records (to schedule,
armed, claimed), the claim guards and the walk in (due_at, id) order."""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, literal_column, or_
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import ColumnClause

from dueflow.domain.timers import TimerKind, TimerState
from dueflow.store import tally
from dueflow.store.schema import timers

SKIP_LOCKED_DIALECTS = {"postgresql", "mysql", "mariadb"}
# States compared as SQL literals, not parameters: the planner then knows a query stays inside the
# partial index on live timers (PostgreSQL, SQLite) even as a generic prepared plan.
SCHEDULED: ColumnClause[str] = literal_column("'scheduled'")
CLAIMED: ColumnClause[str] = literal_column("'claimed'")
PARKED: ColumnClause[str] = literal_column("'parked'")
KINDS = {kind.value: kind for kind in TimerKind}


@dataclass(frozen=True)
class NewTimer:
    """A timer to schedule."""

    order_id: int
    kind: TimerKind
    due_at: datetime


@dataclass(frozen=True)
class Armed:
    """A scheduled timer as a trigger needs to know it."""

    id: int
    due_at: datetime


@dataclass(frozen=True)
class Claimed:
    """A timer this worker holds under ``token`` until ``lease_until``."""

    id: int
    order_id: int
    kind: TimerKind
    deadline_at: datetime
    due_at: datetime
    attempts: int
    token: str
    #: The handler's failures on it in a row before this claim.
    failures: int = 0
    #: The traceparent of the span that armed it (None while tracing was off).
    trace_parent: str | None = None


def new_token() -> str:
    """A fresh claim token (the fence that tells our claim from a later one)."""
    return secrets.token_hex(8)


#: The states an order move cancels and an operator's "run again" revives.
WAITING = (TimerState.SCHEDULED.value, TimerState.PARKED.value)


def in_state(state: TimerState) -> Any:
    """The state test of a statement that finds its timers by id, written so that no index can
    serve it (COALESCE of a column that is never NULL): the planner then goes by the ids. With a
    plain ``state = 'claimed'`` PostgreSQL may walk the live-timers index over every claim in
    flight instead (after a herd its statistics still say there are hardly any): thousands of
    rows read for each statement of a batch."""
    return func.coalesce(timers.c.state, "") == state.value


def locking(conn: AsyncConnection, query: Any) -> Any:
    if conn.dialect.name in SKIP_LOCKED_DIALECTS:
        return query.with_for_update(skip_locked=True)
    return query


def walk(query: Any, after: tuple[datetime, int] | None, limit: int) -> Any:
    """The next page of a walk in (due_at, id) order, after the cursor ``after``."""
    if after is not None:
        query = query.where(
            or_(
                timers.c.due_at > after[0],
                and_(timers.c.due_at == after[0], timers.c.id > after[1]),
            )
        )
    return query.order_by(timers.c.due_at, timers.c.id).limit(limit)


def by_token(claimed: Sequence[Claimed]) -> list[tuple[str, list[int]]]:
    """The claims' ids grouped by the claim token they are held under."""
    groups: dict[str, list[int]] = defaultdict(list)
    for timer in claimed:
        groups[timer.token].append(timer.id)
    return list(groups.items())


def held_under(conn: AsyncConnection, ids: Sequence[int], token: str) -> tuple[Any, ...]:
    """The guard of a statement on claims: these ids, still claimed under ``token``."""
    return (
        tally.among(conn, timers.c.id, ids),
        timers.c.claim_token == token,
        in_state(TimerState.CLAIMED),
    )
