"""The seat-state cache: a fast copy of which seats of a show are held or sold, for the seat
map and as a pre-check that refuses an obviously taken seat without touching the database.

The database decides every sale (a unique key on live seat holds); the cache is written after
commit, moving a seat only from the state the writer expects, and repaired by the reconciler.
Without Redis, :class:`NoSeatCache` answers "not cached" and the database is read.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from dueflow.store.shows import SeatMove


class SeatCache(ABC):
    """Seat states per show, by seat label: ``held`` or ``sold``; a seat not in the cache of a
    loaded show is free."""

    @abstractmethod
    async def moved(self, moves: Sequence[SeatMove]) -> None:
        """After a commit: move each seat from ``before`` to ``after``, only where the cache
        has it in ``before`` (a repeat, or a cache that already knows better, changes
        nothing)."""

    @abstractmethod
    async def states(self, show_id: int) -> Mapping[str, str] | None:
        """Seat label -> held | sold for the show's taken seats, or None when the show is not
        in the cache (read the database)."""

    @abstractmethod
    async def taken(self, show_id: int, labels: Sequence[str]) -> set[str] | None:
        """Which of these seats the cache says are held or sold; None when it cannot say (the
        show is not loaded, or the cache is down)."""

    @abstractmethod
    async def load(self, show_id: int, states: Mapping[str, str]) -> int:
        """Make the cache of the show exactly ``states`` (the database's: label -> held |
        sold); returns how many seats differed (the reconciler's repairs)."""

    async def close(self) -> None:  # noqa: B027 - most caches hold nothing to let go of
        """Let go of connections."""


class NoSeatCache(SeatCache):
    """No cache: every seat map and check reads the database."""

    async def moved(self, moves: Sequence[SeatMove]) -> None:
        return None

    async def states(self, show_id: int) -> Mapping[str, str] | None:
        return None

    async def taken(self, show_id: int, labels: Sequence[str]) -> set[str] | None:
        return None

    async def load(self, show_id: int, states: Mapping[str, str]) -> int:
        return 0
