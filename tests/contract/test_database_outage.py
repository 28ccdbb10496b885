"""A database that cannot be reached (issue 23, item 13): dueflow reaches the real PostgreSQL or
MariaDB through a TCP proxy that the test cuts (refused, reset), turns silent (accepts, never
answers: a timeout), or a host that does not resolve. Every request and ``/readyz`` answer 503
naming the database, never a 500 or the driver's text; the log says so a line a second, never a
traceback a request; once the proxy is back the next requests succeed. The shared servers are
never stopped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy.engine import make_url

from dueflow import logs
from dueflow.api.app import create_app
from dueflow.exceptions import DatabaseUnavailable
from dueflow.service import accounts
from dueflow.store import db as db_module
from dueflow.store.db import Database
from tests.conftest import SERVICE_URLS, World, eventually, require_service, world_at
from tests.proxy import Proxy

PORTS = {"postgres": 5432, "mysql": 3306}
#: What a client is told while the database is away.
AWAY = {
    "code": "backend_unavailable",
    "message": "The database is unavailable; try again later.",
    "field": None,
}
#: Pieces of the drivers' own texts that must not be in an answer.
DRIVER_WORDS = ("Connect call failed", "Errno", "asyncpg", "asyncmy", "2003", "Timeout", "gaierror")


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def server_url(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    require_service(name, "127.0.0.1", PORTS[name])
    url = SERVICE_URLS[name]
    assert url is not None
    return url


@pytest.fixture
async def proxy(server_url: str) -> AsyncIterator[Proxy]:
    parts = urlsplit(server_url)
    made = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await made.start()
    try:
        yield made
    finally:
        if made.listening:
            await made.cut()


@pytest.fixture
async def world(server_url: str, proxy: Proxy) -> AsyncIterator[World]:
    """A world whose database is reached through ``proxy``."""
    through = make_url(server_url).set(host="127.0.0.1", port=proxy.port)
    async for built in world_at(through.render_as_string(hide_password=False)):
        yield built


@pytest.fixture(autouse=True)
def one_line_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    """A throttled line is written once for the whole test (however long it takes here), with
    nothing remembered from earlier tests."""
    monkeypatch.setattr(logs, "_throttled", {})
    monkeypatch.setattr(logs, "THROTTLE_SECONDS", 3600.0)


class Api:
    """The HTTP app over ``world``'s deps, with a buyer's token and an order of theirs."""

    def __init__(self, world: World, client: httpx.AsyncClient, token: str, order_id: int):
        self.world = world
        self.client = client
        self.auth = {"Authorization": f"Bearer {token}"}
        self.order_id = order_id

    async def every_kind(self) -> list[httpx.Response]:
        """A read, a list, a write, an unauthenticated notification and readiness."""
        get = self.client.get
        return [
            await get(f"/api/orders/{self.order_id}", headers=self.auth),
            await get("/api/goods", headers=self.auth),
            await self.client.post(
                f"/api/orders/{self.order_id}/cancel", headers=self.auth, json={}
            ),
            await self.client.post("/notify/alipay", data={"out_trade_no": "x"}),
            await get("/readyz"),
        ]

    async def serves(self) -> bool:
        answer = await self.client.get(f"/api/orders/{self.order_id}", headers=self.auth)
        ready = await self.client.get("/readyz")
        return answer.status_code == 200 and ready.status_code == 200


@pytest.fixture
async def api(world: World) -> AsyncIterator[Api]:
    deps = world.deps
    buyer, token = await accounts.add_user(deps, "outage-buyer")
    goods_id = await world.goods()
    from dueflow.service import orders

    order_id = await orders.place_order(deps, buyer_id=buyer.id, goods_id=goods_id)
    transport = httpx.ASGITransport(app=create_app(deps), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        made = Api(world, client, token, order_id)
        assert await made.serves()
        yield made


def assert_unavailable(answers: list[httpx.Response]) -> None:
    *requests, ready = answers
    for answer in requests:
        assert (answer.status_code, answer.json()) == (503, {"error": AWAY}), answer.text
    assert ready.status_code == 503, ready.text
    assert ready.json()["not_ready"]["database"] == "the database does not answer"
    for answer in answers:
        for word in DRIVER_WORDS:
            assert word.lower() not in answer.text.lower(), answer.text


def assert_logged_once(caplog: pytest.LogCaptureFixture, says: str) -> None:
    """No traceback; the database's trouble a line, not a line a request."""
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert "Traceback" not in caplog.text
    lines = [r for r in caplog.records if r.name == "dueflow.store.db"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert says in lines[0].getMessage()


async def test_a_database_cut_away_answers_503_naming_it_until_it_comes_back(
    api: Api, proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    await proxy.cut()
    with caplog.at_level(logging.WARNING):
        # Refused: the pool's connections are gone with the cut, new ones are refused.
        for _ in range(3):
            assert_unavailable(await api.every_kind())
    refused = [r for r in caplog.records if "Connect" in r.getMessage()]
    assert refused, caplog.text
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert "Traceback" not in caplog.text
    # Every request failed alike: far fewer lines than requests (one per distinct trouble).
    assert len([r for r in caplog.records if r.name == "dueflow.store.db"]) <= 3, caplog.text

    await proxy.start()
    assert await eventually(api.serves, seconds=10, interval=0.1)


async def test_a_database_that_never_answers_times_out_as_503(
    api: Api, proxy: Proxy, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_module, "CONNECT_SECONDS", 0.3)
    await proxy.hang()
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert_unavailable(await api.every_kind())
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert any("no answer in 0.3 s" in r.getMessage() for r in caplog.records), caplog.text

    proxy.silent = False
    assert await eventually(api.serves, seconds=10, interval=0.1)


async def test_a_database_host_that_does_not_resolve_answers_503(
    api: Api, server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    deps = api.world.deps
    reachable = deps.db
    unresolvable = make_url(server_url).set(host="dueflow-db.invalid")
    deps.db = Database.from_url(unresolvable.render_as_string(hide_password=False))
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                assert_unavailable(await api.every_kind())
        assert_logged_once(caplog, "Name or service not known")
        with pytest.raises(DatabaseUnavailable):
            async with deps.db.read():
                pass
    finally:
        await deps.db.dispose()
        deps.db = reachable
    assert await api.serves()


async def test_a_worker_logs_an_outage_a_line_not_a_traceback_a_loop(
    world: World, proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's loop meets the outage at every wake-up: one line says so, no traceback."""
    deps = world.deps
    await proxy.cut()

    def loops_failed(count: int) -> bool:
        key = ("dueflow.worker.runner", "worker loop error; retrying shortly")
        written = key in logs._throttled
        held = logs._throttled.get(key, (0.0, 0))[1]
        if written and held + 1 < count:
            world.clock.advance(deps.max_idle)  # the next wake-up
        return written and held + 1 >= count

    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING):
        loop = asyncio.create_task(world.worker.run(stop))
        try:
            for failed in (1, 2, 3, 4):
                assert await eventually(lambda n=failed: loops_failed(n), interval=0.02)
        finally:
            stop.set()
            await loop
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    lines = [r.getMessage() for r in caplog.records if r.name == "dueflow.worker.runner"]
    assert lines == [
        "worker loop error; retrying shortly: The database is unavailable; try again later."
    ]
