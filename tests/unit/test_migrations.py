from __future__ import annotations

from alembic.script import ScriptDirectory

from dueflow.store import migrate
from dueflow.store.db import Database
from dueflow.store.schema import metadata


def test_head_constant_matches_the_scripts():
    scripts = ScriptDirectory.from_config(migrate.alembic_config())
    assert scripts.get_current_head() == migrate.HEAD == "0022"  # the dashboard's indexes
    # one line of revisions, 0001 to the head, each on the one before
    line = [s.revision for s in scripts.walk_revisions()]
    assert line == [f"{n:04d}" for n in range(22, 0, -1)]


async def test_migrations_create_exactly_the_schema(tmp_path):
    db = Database.from_url(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        assert not await migrate.at_head(db)
        await migrate.upgrade(db)
        assert await migrate.at_head(db)
        assert await migrate.current_tables(db) == set(metadata.tables) | {"alembic_version"}
        shop = {"skus", "flash_sales", "flash_buyers", "coupon_templates", "coupons"}
        assert shop | {"idempotency_keys"} <= await migrate.current_tables(db)
        await migrate.upgrade(db)  # idempotent
    finally:
        await db.dispose()
