"""Steps registered with ``store.db.after_commit``: run once the write commits, outside the
SQLite write lock, never after a rollback, and a failing one never fails what committed."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dueflow.store.db import after_commit
from dueflow.store.schema import users


async def test_runs_after_the_commit_outside_the_write_lock(world):
    db = world.deps.db
    seen: list[tuple[int, bool]] = []

    async def hook() -> None:
        async with db.read() as conn:  # the new row is visible: committed
            count = len((await conn.execute(select(users.c.id))).all())
        assert db._write_lock is not None
        seen.append((count, db._write_lock.locked()))

    async with db.write() as conn:
        before = len((await conn.execute(select(users.c.id))).all())
        await conn.execute(
            users.insert().values(
                name="late", token_hash="x", is_admin=False, created_at=world.clock.now()
            )
        )
        after_commit(conn, hook)
        assert seen == []
    assert seen == [(before + 1, False)]


async def test_never_runs_after_a_rollback(world):
    ran: list[str] = []

    async def hook() -> None:
        ran.append("ran")

    with pytest.raises(RuntimeError):
        async with world.deps.db.write() as conn:
            after_commit(conn, hook)
            raise RuntimeError("the transaction fails")
    assert ran == []


async def test_a_failing_step_is_logged_not_raised(world, caplog):
    async def broken() -> None:
        raise ConnectionError("the cache is down")

    done: list[str] = []

    async def next_one() -> None:
        done.append("next")

    async with world.deps.db.write() as conn:
        after_commit(conn, broken)
        after_commit(conn, next_one)
    assert done == ["next"]
    assert "after-commit step failed" in caplog.text


async def test_needs_a_write_transaction(world):
    async def hook() -> None:
        return None

    async with world.deps.db.read() as conn:
        with pytest.raises(RuntimeError, match=r"Database\.write"):
            after_commit(conn, hook)
