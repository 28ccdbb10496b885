"""SQLite WAL checkpoints, off the event loop.

With ``synchronous=NORMAL`` a commit in WAL mode only appends pages to the WAL: no fsync. What
waits on the disk is the checkpoint, which copies the WAL back into the database file and syncs
both files; SQLite runs it inside whichever commit takes the WAL past 1,000 pages, and dueflow's
commits run on the event loop (``store/sqlite_inline.py``). So the write connections are opened
with ``wal_autocheckpoint=0`` and this checkpointer does the work on a thread of its own, through
a connection of its own:

1. ``PASSIVE``: copies every frame no reader still needs and syncs, taking no lock a writer
   waits for; commits go on meanwhile.
2. When that caught up with the WAL, ``RESTART``: copies the few frames committed meanwhile and
   makes the next commit write the WAL from its start, over the same file (measured here, a
   commit that appends to a WAL just truncated to nothing costs about twice as much). A WAL
   that has reached :attr:`Bounds.wal_bytes`, and the last one on close, is truncated instead
   (``TRUNCATE``), so the file's size stays a measure of what it holds. The reset blocks
   writers while it runs, so it holds the process's own write lock (writers queue on the loop,
   not in SQLite's busy handler) and waits for readers only briefly.

A reader holding an old snapshot (a long report) keeps the frames after it from being copied,
and the WAL grows until it ends. Past :attr:`Bounds.hard_bytes` the reset waits for such readers
(:attr:`Bounds.hard_wait`, writers held meanwhile), so the WAL stays bounded unless a reader
holds its snapshot longer than that; then it is logged and tried again later.

A checkpoint is due :attr:`Bounds.interval` after the first commit since the last one, or as
soon as the WAL reaches :attr:`Bounds.wal_bytes` (looked at every :attr:`Bounds.look_every`
commits). Between commits it costs nothing: the task waits for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
Mode = Literal["PASSIVE", "RESTART", "TRUNCATE"]


@dataclass(frozen=True)
class Bounds:
    """When a checkpoint is due, and how long its reset may hold writers."""

    #: Seconds after the first commit since the last checkpoint when the next one is due. A
    #: small WAL is cheaper to append to: measured with 32 clients placing orders, the median
    #: commit took 85 µs at 0.05 s (a WAL of a few MiB) and 136 µs at 0.2 s or 1 s.
    interval: float = 0.05
    #: A WAL this large is due at once, and truncated by the reset (SQLite's own automatic
    #: checkpoint comes at 1,000 pages, 4 MiB; a place order writes about 11 pages, so the
    #: interval comes first below about 7,000 orders a second).
    wal_bytes: int = 16 * 1024 * 1024
    #: Commits between two looks at the WAL's size.
    look_every: int = 32
    #: Past this, the reset waits for readers holding old snapshots (writers held meanwhile).
    hard_bytes: int = 64 * 1024 * 1024
    #: How long a reset waits for readers below the hard bound (seconds).
    short_wait: float = 0.02
    #: How long it waits past the hard bound, and on close.
    hard_wait: float = 1.0
    #: After a hard reset that could not finish, the next one waits this long (seconds).
    hard_backoff: float = 10.0


@dataclass(frozen=True)
class Outcome:
    """What one checkpoint did: the WAL's frames and those copied into the database (PASSIVE),
    the reset's mode (None: none tried) and whether it finished."""

    wal_bytes: int
    frames: int
    copied: int
    reset: Mode | None
    reset_done: bool


class Checkpointer:
    """Checkpoints one SQLite file's WAL on a thread; see the module's description."""

    def __init__(
        self,
        path: str,
        bounds: Bounds | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.bounds = bounds or Bounds()
        self._monotonic = monotonic
        self._commits = 0
        self._first_commit_at: float | None = None
        self._hard_after = 0.0
        self._retry_at = 0.0
        self._conn: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._write_lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: What the last checkpoint did (None before the first).
        self.last: Outcome | None = None

    @property
    def running(self) -> bool:
        """Whether the background task runs (from the first write to :meth:`close`)."""
        return self._task is not None and not self._task.done()

    def start(self, write_lock: asyncio.Lock) -> None:
        """Start checkpointing in the background on the running loop; ``write_lock`` is the
        lock this process's writers queue on (held while a reset blocks them anyway)."""
        if self._task is not None:
            return
        self._write_lock = write_lock
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="dueflow-sqlite-checkpoint"
        )

    def committed(self) -> None:
        """Note a commit (called on the loop after each write transaction; cheap)."""
        self._commits += 1
        if self._first_commit_at is None:
            self._first_commit_at = self._monotonic()
        if self._wake is not None and self._commits % self.bounds.look_every in (0, 1):
            self._wake.set()

    def wal_bytes(self) -> int:
        """The WAL file's size (0 when there is none)."""
        try:
            return os.stat(self.path + "-wal").st_size
        except FileNotFoundError:
            return 0

    def due_in(self) -> float | None:
        """Seconds until a checkpoint is due: 0 now, None while nothing was committed."""
        if self._first_commit_at is None:
            return None
        now = self._monotonic()
        if self._hard() or (now >= self._retry_at and self.wal_bytes() >= self.bounds.wal_bytes):
            return 0.0
        return max(0.0, self._first_commit_at + self.bounds.interval - now)

    async def step(self) -> Outcome | None:
        """Checkpoint if one is due (what the background task does each time it wakes)."""
        if self.due_in() != 0.0:
            return None
        return await self.checkpoint()

    async def checkpoint(self, *, final: bool = False) -> Outcome:
        """Copy the WAL into the database and, when nothing holds it back, reset it."""
        hard = final or self._hard()
        size = self.wal_bytes()
        self._commits = 0
        self._first_commit_at = None
        busy, frames, copied = await self._in_thread(lambda: self._pragma("PASSIVE", 0.0))
        reset: Mode | None = None
        done = False
        if hard or (not busy and copied == frames):
            reset = "TRUNCATE" if final or size >= self.bounds.wal_bytes else "RESTART"
            wait = self.bounds.hard_wait if hard else self.bounds.short_wait
            mode = reset
            async with self._writers_held(final):
                busy, frames, copied = await self._in_thread(lambda: self._pragma(mode, wait))
            done = not busy
            if hard and not done:
                self._hard_after = self._monotonic() + self.bounds.hard_backoff
                log.warning(
                    "SQLite WAL at %.1f MiB: a reader holds an old snapshot; the WAL is "
                    "reset when it ends",
                    size / 2**20,
                )
        if not done:
            # Not reset: due again one interval from now, new commits or not (the size alone
            # does not make it due before then).
            self._first_commit_at = self._retry_at = self._monotonic()
            self._retry_at += self.bounds.interval
        self.last = Outcome(size, frames, copied, reset, done)
        return self.last

    async def close(self) -> None:
        """Stop the task, checkpoint a last time (TRUNCATE) and close the connection. Call it
        after every pooled connection of this process is closed."""
        if self._task is not None:
            # The flag as well as the cancel: a cancel that comes as the task's wait ends may
            # be lost (3.11's wait primitives), and the task would then run on.
            self._stopping = True
            if self._wake is not None:
                self._wake.set()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._thread is None and self._task is None:
            return
        self._task = None
        try:
            await self.checkpoint(final=True)
        except (sqlite3.Error, OSError) as error:
            log.warning("the last SQLite checkpoint failed: %s", error)
        finally:
            if self._thread is not None:
                await self._in_thread(self._close_connection)
                self._thread.shutdown(wait=True)
                self._thread = None

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            delay = self.due_in()
            if delay != 0.0:
                # Nothing committed (None): wait for a commit. Otherwise wait for the interval
                # to end or for a commit that may make the WAL's size due, then look again.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                self._wake.clear()
                continue
            try:
                await self.checkpoint()
            except (sqlite3.Error, OSError) as error:
                # The WAL only grows meanwhile; try again after an interval.
                log.warning("an SQLite checkpoint failed: %s", error)
                await asyncio.sleep(self.bounds.interval)

    def _hard(self) -> bool:
        return self._monotonic() >= self._hard_after and self.wal_bytes() >= self.bounds.hard_bytes

    @contextlib.asynccontextmanager
    async def _writers_held(self, final: bool) -> AsyncIterator[None]:
        # On close the pools are closed: no writer of this process is left to hold off, and a
        # lock never released (a writer's task abandoned mid-transaction) must not hang it.
        if self._write_lock is None or final:
            yield
        else:
            async with self._write_lock:
                yield

    async def _in_thread(self, call: Callable[[], T]) -> T:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="dueflow-checkpoint")
        return await asyncio.get_running_loop().run_in_executor(self._thread, call)

    def _pragma(self, mode: Mode, wait: float) -> tuple[int, int, int]:
        """On the thread: one ``wal_checkpoint`` in ``mode``, waiting at most ``wait`` seconds
        for the locks it needs; (busy, frames in the WAL, frames copied)."""
        if self._conn is None:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.execute(f"PRAGMA busy_timeout={int(wait * 1000)}")
        row = self._conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
        return int(row[0]), int(row[1]), int(row[2])

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
