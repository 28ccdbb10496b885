"""The timer tables: timers (the durable deadlines) and the reminders they send."""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)

from dueflow.domain.timers import MUST_HAPPEN
from dueflow.store._schema_base import table_with_id
from dueflow.store.types import Id, UTCDateTime

LIVE_TIMERS = "state IN ('scheduled', 'claimed')"
PARKED_TIMERS = "state = 'parked'"
#: Live timers flagged stuck (the dashboard's count and list): a few, among every live timer.
STUCK_TIMERS = "stuck AND state IN ('scheduled', 'claimed')"
#: The must-happen timers waiting (domain/timers.MUST_HAPPEN), as the claim of a worker that is
#: behind writes them (literals, so the planner proves the partial index serves it).
MUST_HAPPEN_KINDS = "(" + ", ".join(f"'{kind.value}'" for kind in sorted(MUST_HAPPEN)) + ")"
MUST_HAPPEN_WAITING = f"state = 'scheduled' AND kind IN {MUST_HAPPEN_KINDS}"


timers = table_with_id(
    "timers",
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False),
    Column("kind", String(32), nullable=False),
    # deadline_at: the business deadline (for lateness); due_at: when to fire next (backoff moves it).
    Column("deadline_at", UTCDateTime, nullable=False),
    Column("due_at", UTCDateTime, nullable=False),
    Column("state", String(16), nullable=False),
    # attempts: every claim; failures: the handler's failures in a row (a handler's own retry,
    # such as a refund still processing, is none), which park the timer at timer_max_attempts.
    Column("attempts", Integer, nullable=False, default=0),
    Column("failures", Integer, nullable=False, default=0, server_default=text("0")),
    Column("lease_until", UTCDateTime),
    Column("claim_token", String(32)),
    Column("stuck", Boolean, nullable=False, default=False),
    Column("last_error", Text),
    Column("outcome", String(200)),
    Column("created_at", UTCDateTime, nullable=False),
    Column("done_at", UTCDateTime),
    # The W3C traceparent of the span that armed it (its handler's span links there); NULL
    # while tracing is off (dueflow/tracing.py).
    Column("trace_parent", String(55)),
    UniqueConstraint("order_id", "kind"),
    # Due scans: an equality on state, then a range on due_at, keeps an empty scan one seek.
    # Partial (live timers only) on PostgreSQL: done timers cost the index nothing. SQLite keeps
    # the full index: its planner cannot prove state = 'scheduled' implies state IN (...).
    Index(
        "ix_timers_live",
        "state",
        "due_at",
        "id",
        postgresql_where=text(LIVE_TIMERS),
    ),
    # The dashboard's lateness over the last hour reads done timers by when they fired.
    Index("ix_timers_done_at", "done_at"),
    # The dashboard's parked timers, soonest due first: outside ix_timers_live on PostgreSQL,
    # so a partial index of their own there; elsewhere ix_timers_live serves them too.
    Index("ix_timers_parked", "state", "due_at", postgresql_where=text(PARKED_TIMERS)),
    # A worker that is behind claims the must-happen timers first: partial, so that claim walks
    # them alone in due order, past any wall of messages due before them. PostgreSQL and SQLite
    # only (MySQL has no partial index; there the claim walks ix_timers_live).
    # State leads, as in ix_timers_live, though the index holds one state: SQLite (no
    # statistics) then takes it over ix_timers_parked for the claim.
    Index(
        "ix_timers_must",
        "state",
        "due_at",
        "id",
        postgresql_where=text(MUST_HAPPEN_WAITING),
        sqlite_where=text(MUST_HAPPEN_WAITING),
    ).ddl_if(dialect=("postgresql", "sqlite")),  # type: ignore[arg-type]  # a tuple: documented
    # The stuck timers, soonest due first: partial, so counting and listing them reads them
    # alone, not every live timer. PostgreSQL and SQLite only (MySQL walks ix_timers_live).
    Index(
        "ix_timers_stuck",
        "due_at",
        "id",
        postgresql_where=text(STUCK_TIMERS),
        sqlite_where=text(STUCK_TIMERS),
    ).ddl_if(dialect=("postgresql", "sqlite")),  # type: ignore[arg-type]  # a tuple: documented
)

reminders = table_with_id(
    "reminders",
    Column("order_id", Id, ForeignKey("orders.id"), nullable=False),
    Column("kind", String(32), nullable=False),
    # pending | sending (claimed by one handler until lease_until) | sent | unknown (sent, no
    # answer ever confirmed it, and no more sends: out of sends or the order moved on)
    Column("state", String(16), nullable=False),
    Column("claim_token", String(32)),
    Column("lease_until", UTCDateTime),
    Column("created_at", UTCDateTime, nullable=False),
    Column("sent_at", UTCDateTime),
    # Sends that may have reached the receiver: counted before each send, uncounted when the
    # send provably did not deliver (refused, or answered with an error).
    Column("deliveries", Integer, nullable=False, default=0, server_default=text("0")),
    UniqueConstraint("order_id", "kind"),
)
