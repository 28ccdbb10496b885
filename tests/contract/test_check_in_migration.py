"""Migration 0020 (ticket check-in) on SQLite, PostgreSQL and MariaDB: with a ticket issued, down
to 0018 its check-in columns and index go (the ticket stays); up again, the schema equals
``metadata`` and the ticket, not checked in, is checked in once."""

from __future__ import annotations

from sqlalchemy import inspect

from dueflow.clock import FakeClock
from dueflow.store import migrate, schema
from dueflow.store.db import Database
from tests.conftest import START, RecordingNotifier
from tests.contract import migration_kit
from tests.unit.api import running_api

CHECK_IN = {"checked_in_at", "checked_in_gate", "checked_in_by"}


async def _ticket_columns(db: Database) -> set[str]:
    async with db.engine.connect() as conn:
        found = await conn.run_sync(lambda sync: inspect(sync).get_columns(schema.tickets.name))
    return {c["name"] for c in found}


async def test_0020_down_and_up_with_a_ticket_issued(empty_url: str) -> None:
    db = Database.from_url(empty_url)
    try:
        await migrate.upgrade(db)
    finally:
        await db.dispose()
    async with (
        migration_kit.running(empty_url, FakeClock(START), RecordingNotifier()) as deps,
        running_api(deps) as api,
    ):
        code = await api.paid_ticket(await api.show(), "A-1")
        await migration_kit.downgrade(deps.db, "0018")
        assert await migrate.revisions(deps.db) == {"0018"}
        assert CHECK_IN.isdisjoint(await _ticket_columns(deps.db))
        await migrate.upgrade(deps.db)
        assert await migration_kit.schema_differences(deps.db) == []
        assert await _ticket_columns(deps.db) >= CHECK_IN
        path = f"/api/tickets/{code}/check-in"
        let_in = await api.call("POST", path, "seller", json={"gate": "West"})
        assert let_in.status_code == 200, let_in.text
        again = await api.call("POST", path, "seller", json={})
        assert again.status_code == 409 and "gate West" in again.json()["error"]["message"]
