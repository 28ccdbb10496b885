"""The database's trouble, translated once at the adapter's edge: dropped connections found
(:class:`Liveness`), driver errors turned into dueflow's (:func:`translate`), logged a line per
distinct trouble."""

from __future__ import annotations

import logging

from sqlalchemy import exc

from dueflow import logs
from dueflow.exceptions import (
    BackendUnavailable,
    Busy,
    Conflict,
    DatabaseUnavailable,
    DueflowError,
    UnstorableValue,
)

#: The database's log, under the name it had before this part left db.py (log filters).
log = logging.getLogger("dueflow.store.db")


def protocol_broken(error: BaseException | None) -> bool:
    """asyncpg's InternalClientError ("cannot switch to state 12; another operation (2) is in
    progress"): the connection's protocol was left in the middle of an operation, so it can
    never run another, though it is not closed. About one connection in ten that the server
    terminates in the middle of a transaction fails so rather than as "connection is closed"
    (the chaos soak's pg_terminate_backend); SQLAlchemy 2.1's asyncpg dialect does not count it
    as a disconnect."""
    return error is not None and type(error).__name__ == "InternalClientError"


#: What the driver errors are translated to, with the message a client may see (an unreachable
#: database is a DatabaseUnavailable, which names it).
MESSAGES: dict[type[DueflowError], str] = {
    Conflict: "the change conflicts with what is stored",
    UnstorableValue: "a value cannot be stored: text the database refuses, or a number out of range",
    Busy: "database busy, try again",
    BackendUnavailable: DatabaseUnavailable().message,
}
#: Words of the lock errors that carry no SQLSTATE to go by (SQLite's, MySQL's lock wait).
_LOCK_WORDS = ("locked", "busy", "deadlock", "could not serialize", "lock wait timeout")


DriverError = exc.DBAPIError | exc.TimeoutError | UnicodeEncodeError


def translate(error: DriverError) -> DueflowError:
    """A driver error as dueflow's own, the driver's text logged and kept out of its message.

    A constraint violation (SQLSTATE class 23) is a Conflict and a value the database cannot
    hold (class 22, or text the driver cannot encode, such as a lone surrogate) is an
    UnstorableValue: retrying the same request cannot help. A deadlock, serialization failure
    (class 40) or lock wait is Busy; anything else (unreachable, no schema, no pooled
    connection free in time) DatabaseUnavailable, logged a line a second at most however many
    requests meet it (:func:`dueflow.logs.throttled`).
    """
    kind = _kind(error)
    detail = error.orig if isinstance(error, exc.DBAPIError) else error
    if kind is BackendUnavailable:
        logs.throttled(
            log, logging.WARNING, str(detail), "database unavailable: %s", detail or repr(detail)
        )
        return DatabaseUnavailable(MESSAGES[kind])
    level = logging.INFO if kind in (Busy, Conflict) else logging.WARNING
    log.log(level, "database error taken as %s: %s", kind.__name__, detail)
    return kind(MESSAGES[kind])


def _kind(error: DriverError) -> type[DueflowError]:
    if isinstance(error, exc.TimeoutError):
        return BackendUnavailable  # every pooled connection busy connecting or in use
    if isinstance(error, UnicodeEncodeError | exc.DataError):
        return UnstorableValue
    if isinstance(error, exc.IntegrityError):
        return Conflict
    state = str(getattr(error.orig, "sqlstate", None) or "")
    if state.startswith("22"):
        return UnstorableValue
    if state.startswith("23"):
        return Conflict
    text = str(error.orig).lower()
    if state.startswith("40") or state == "55P03" or any(w in text for w in _LOCK_WORDS):
        return Busy
    return BackendUnavailable
