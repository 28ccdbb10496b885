"""Driver errors are translated once, by kind, and their text never reaches a client (issue 9,
item 7): bad text that gets past the edge is refused as a value the database cannot store (not
as an outage), a constraint violation is a conflict, an unreachable database says only that."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from dueflow.api import errors
from dueflow.exceptions import BackendUnavailable, Conflict, UnstorableValue
from dueflow.service import accounts
from dueflow.service.deps import Deps
from dueflow.store import goods, users
from dueflow.store.db import Database
from tests.conftest import SERVICE_URLS, require_service, table_snapshot

#: Pieces of the drivers' own texts that must not be in an answer.
DRIVER_WORDS = ("UTF8", "0x00", "byte sequence", "surrogates", "codec", "does not exist", "asyncpg")


async def answer_of(action: Callable[[], Awaitable[Any]]) -> httpx.Response:
    """What the API's error handler answers when a route runs ``action``."""
    app = FastAPI()
    errors.install(app)

    @app.post("/act")
    async def act() -> dict[str, str]:
        await action()
        return {"done": "yes"}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        return await client.post("/act")


def assert_no_driver_text(answer: httpx.Response) -> None:
    for word in DRIVER_WORDS:
        assert word.lower() not in answer.text.lower(), answer.text


@pytest.fixture
def postgres_url() -> str:
    require_service("postgres", "127.0.0.1", 5432)
    url = SERVICE_URLS["postgres"]
    assert url is not None
    return url


@pytest.mark.postgres
@pytest.mark.parametrize("backend_url", ["postgres"], indirect=True)
async def test_a_nul_title_past_the_edge_is_unstorable_not_unavailable(backend_world, caplog):
    deps: Deps = backend_world.deps
    before = await table_snapshot(deps)

    async def add() -> None:
        await accounts.add_goods(deps, seller_id=backend_world.seller, title="a\x00b", price="1")

    with pytest.raises(UnstorableValue) as info, caplog.at_level(logging.WARNING):
        await add()
    assert "0x00" not in info.value.message
    assert "0x00" in caplog.text  # the driver's text is for the log
    answer = await answer_of(add)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "unstorable_value"
    assert_no_driver_text(answer)
    assert await table_snapshot(deps) == before


async def test_a_lone_surrogate_past_the_edge_is_unstorable(backend_world):
    deps: Deps = backend_world.deps
    before = await table_snapshot(deps)

    async def add() -> None:
        await accounts.add_goods(deps, seller_id=backend_world.seller, title="a\ud800", price="1")

    with pytest.raises(UnstorableValue):
        await add()
    answer = await answer_of(add)
    assert answer.status_code == 422, answer.text
    assert_no_driver_text(answer)
    assert await table_snapshot(deps) == before


async def test_a_constraint_violation_is_a_conflict(backend_world):
    deps: Deps = backend_world.deps
    before = await table_snapshot(deps)

    async def same_name_twice() -> None:
        async with deps.db.write() as conn:
            now = deps.clock.now()
            await users.insert_user(conn, name="twin", token_hash="a" * 64, is_admin=False, now=now)
            await users.insert_user(conn, name="twin", token_hash="b" * 64, is_admin=False, now=now)

    with pytest.raises(Conflict):
        await same_name_twice()
    answer = await answer_of(same_name_twice)
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"] == {
        "code": "conflict",
        "message": "the change conflicts with what is stored",
        "field": None,
    }
    assert await table_snapshot(deps) == before


async def test_a_number_out_of_range_is_unstorable(backend_world):
    deps: Deps = backend_world.deps
    if deps.db.dialect == "sqlite":
        pytest.skip("SQLite stores any number in any column")
    before = await table_snapshot(deps)

    async def too_dear() -> None:
        async with deps.db.write() as conn:
            await goods.insert_goods(
                conn,
                seller_id=backend_world.seller,
                title="gold",
                price=Decimal("99999999999.00"),
                now=deps.clock.now(),
            )

    with pytest.raises(UnstorableValue):
        await too_dear()
    answer = await answer_of(too_dear)
    assert answer.status_code == 422, answer.text
    assert "out of range" in answer.json()["error"]["message"]
    assert await table_snapshot(deps) == before


@pytest.mark.postgres
async def test_an_unreachable_database_is_unavailable_without_its_text(postgres_url, caplog):
    missing = postgres_url.rsplit("/", 1)[0] + "/h5_no_such_database"
    db = Database.from_url(missing)
    try:

        async def read() -> None:
            async with db.read() as conn:
                await conn.exec_driver_sql("SELECT 1")

        with caplog.at_level(logging.WARNING):
            with pytest.raises(BackendUnavailable) as info:
                await read()
            answer = await answer_of(read)
    finally:
        await db.dispose()
    assert "does not exist" not in info.value.message
    assert "does not exist" in caplog.text
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "backend_unavailable"
    assert_no_driver_text(answer)


async def test_no_backend_detail_reaches_a_client():
    async def redis_down() -> None:
        raise BackendUnavailable(
            "redis locks cannot acquire order:7: Error 111 connecting to h:6379"
        )

    answer = await answer_of(redis_down)
    assert answer.status_code == 503
    assert answer.json()["error"] == {
        "code": "backend_unavailable",
        "message": "A backend cannot be reached.",
        "field": None,
    }

    async def bug() -> None:
        raise RuntimeError("asyncpg internals")

    app_answer = await answer_of_unraised(bug)
    assert app_answer.status_code == 500
    assert app_answer.json()["error"]["code"] == "internal_error"
    assert_no_driver_text(app_answer)


async def answer_of_unraised(action: Callable[[], Awaitable[Any]]) -> httpx.Response:
    """As :func:`answer_of`, for an exception the server would log (not re-raised here)."""
    app = FastAPI()
    errors.install(app)

    @app.post("/act")
    async def act() -> None:
        await action()

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        return await client.post("/act")
