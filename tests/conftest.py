"""Shared fixtures: a migrated SQLite file per test, a controllable clock, wired dependencies."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from dueflow import bootstrap
from dueflow.clock import FakeClock
from dueflow.config import Settings, load_settings
from dueflow.domain import seating
from dueflow.notifiers.base import Notifier, Reminder
from dueflow.service import accounts, shop, tickets
from dueflow.service.deps import Deps
from dueflow.store import migrate, schema
from dueflow.store.db import Database
from dueflow.worker.runner import Worker
from tests import databases

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class RecordingNotifier(Notifier):
    """Keeps what it was asked to send; can be told to fail (unit tests of the layers above)."""

    def __init__(self) -> None:
        self.sent: list[Reminder] = []
        self.fail_with: Exception | None = None

    async def send(self, reminder: Reminder) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.sent.append(reminder)


@dataclass
class World:
    """A migrated database with a seller, a buyer and helpers."""

    deps: Deps
    clock: FakeClock
    notifier: RecordingNotifier
    worker: Worker
    seller: int
    buyer: int
    other: int

    async def goods(self, price: str = "12.50", title: str = "camera") -> int:
        return await accounts.add_goods(self.deps, seller_id=self.seller, title=title, price=price)

    async def show(
        self, seats: str = "A:1-10,B:1-10", *, limit: int = 4, organizer: int | None = None
    ) -> int:
        """A show by the seller (its organizer): section A at 380, B at 180, sales open for
        29 days, starting in 30."""
        specs = seating.parse_ranges(seats, {"A": Decimal("380.00"), "B": Decimal("180.00")})
        return await tickets.create_show(
            self.deps,
            organizer_id=self.seller if organizer is None else organizer,
            title="Winter concert",
            venue="Hall 1",
            starts_at=self.clock.now() + timedelta(days=30),
            sales_close_at=self.clock.now() + timedelta(days=29),
            seat_limit=limit,
            seats=specs,
        )

    async def seats(
        self, show_id: int, labels: list[str], buyer: int | None = None
    ) -> dict[str, Any]:
        """A tickets order of ``buyer`` (the world's buyer) for these seats: its view."""
        return await tickets.place_ticket_order(
            self.deps,
            buyer_id=self.buyer if buyer is None else buyer,
            show_id=show_id,
            labels=labels,
        )

    async def sku(self, stock: int = 10, price: str = "25.00", title: str = "mug") -> int:
        """A SKU of the seller."""
        view = await shop.create_sku(
            self.deps, seller_id=self.seller, title=title, price=price, stock=stock
        )
        return int(view["id"])

    async def coupon(
        self,
        *,
        off: str = "5.00",
        minimum: str = "20.00",
        days: int = 30,
        to: int | None = None,
        total: int = 100,
    ) -> int:
        """A coupon of the seller's shop issued to ``to`` (the world's buyer): valid from now
        for ``days`` days."""
        tpl = await shop.create_template(
            self.deps,
            seller_id=self.seller,
            title=f"{off} off",
            amount_off=off,
            min_amount=minimum,
            valid_from=self.clock.now(),
            valid_until=self.clock.now() + timedelta(days=days),
            total=total,
        )
        issued = await shop.issue_coupon(
            self.deps,
            template_id=tpl["id"],
            issuer_id=self.seller,
            user_id=self.buyer if to is None else to,
        )
        return int(issued["id"])

    async def flash_sale(
        self, sku_id: int, *, stock: int = 10, price: str = "9.90", limit: int = 1
    ) -> int:
        """A flash sale of the SKU open from now for an hour."""
        view = await shop.create_flash_sale(
            self.deps,
            seller_id=self.seller,
            sku_id=sku_id,
            price=price,
            stock=stock,
            starts_at=self.clock.now(),
            ends_at=self.clock.now() + timedelta(hours=1),
            per_buyer_limit=limit,
        )
        return int(view["id"])

    async def shop_order(
        self,
        lines: dict[int, int],
        *,
        coupon: int | None = None,
        buyer: int | None = None,
    ) -> dict[str, Any]:
        """A shop order of ``buyer`` (the world's buyer): units per SKU, and a coupon."""
        return await shop.place_shop_order(
            self.deps,
            buyer_id=self.buyer if buyer is None else buyer,
            lines=[{"sku_id": k, "quantity": q} for k, q in lines.items()],
            coupon_id=coupon,
        )


@pytest.fixture(autouse=True)
def _dueflow_log_level() -> Iterator[None]:
    """Every test finds the ``dueflow`` logger at the level it had: a demo run in process
    (``dueflow demo`` through CliRunner) quiets it for good, and the tests after it that read
    their logs (caplog) would find nothing."""
    logger = logging.getLogger("dueflow")
    level = logger.level
    yield
    logger.setLevel(level)


@pytest.fixture(scope="session")
def migrated_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated SQLite file per session; each test gets a copy (migrations take ~0.5 s)."""
    path = tmp_path_factory.mktemp("template") / "template.db"

    async def build() -> None:
        db = Database.from_url(f"sqlite:///{path}")
        try:
            await migrate.upgrade(db)
        finally:
            await db.dispose()

    asyncio.run(build())
    return path


@pytest.fixture
def db_path(tmp_path: Path, migrated_template: Path) -> Path:
    path = tmp_path / "dueflow.db"
    shutil.copyfile(migrated_template, path)
    return path


@pytest.fixture
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's reruns in place follow each other at once (they wait real time, not the
    clock: the time a dropped connection or a lock needs, not a deadline)."""
    from dueflow.worker import runner

    monkeypatch.setattr(runner, "RERUN_PAUSES", (0.0,) * len(runner.RERUN_PAUSES))


@pytest.fixture
def settings(db_path: Path) -> Settings:
    return load_settings(database_url=f"sqlite:///{db_path}", profile="prod")


@pytest.fixture
async def world(settings: Settings) -> AsyncIterator[World]:
    async for built in world_on(settings):
        yield built


async def world_on(settings: Settings) -> AsyncIterator[World]:
    """A :class:`World` wired from ``settings`` (the ``world`` fixture's, or a test's own)."""
    clock = FakeClock(START)
    notifier = RecordingNotifier()
    async with bootstrap.running(
        settings, clock=clock, notifier=notifier, migrate_sqlite=False
    ) as deps:
        seller, _ = await accounts.add_user(deps, "seller")
        buyer, _ = await accounts.add_user(deps, "buyer")
        other, _ = await accounts.add_user(deps, "other")
        yield World(deps, clock, notifier, Worker(deps), seller.id, buyer.id, other.id)


async def table_snapshot(
    deps: Deps, *, skip: tuple[str, ...] = ()
) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table but ``skip``, in key order: "nothing changed" means this is
    equal before and after. Not ``order_counts``: the dashboard's counts of final orders, which
    a look at the dashboard moves up to its watermark (store/counts.py), whatever else did."""
    result = {}
    async with deps.db.read() as conn:
        for table in schema.metadata.sorted_tables:
            if table.name not in (*skip, "order_counts"):
                query = select(table).order_by(*table.primary_key)
                result[table.name] = [tuple(r) for r in (await conn.execute(query)).all()]
    return result


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


async def eventually(
    predicate: Callable[[], Any], seconds: float = 5.0, interval: float = 0.01
) -> bool:
    """Poll ``predicate`` (sync or async) until it holds or ``seconds`` of real time pass.

    The one place tests wait in real time: for a task, a process or a broker to get somewhere,
    never for a deadline (deadlines move with a FakeClock)."""
    limit = time.monotonic() + seconds
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return True
        if time.monotonic() >= limit:
            return False
        await asyncio.sleep(interval)


def eventually_sync(
    predicate: Callable[[], Any], seconds: float = 5.0, interval: float = 0.01
) -> bool:
    """:func:`eventually` for code outside an event loop (a subprocess, a server thread)."""
    limit = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() >= limit:
            return False
        time.sleep(interval)
    return True


# --- real services -------------------------------------------------------------------------

#: This run's own server databases (tests/databases.py): created as the session starts, dropped
#: as it ends, so two checkouts can test at once.
SERVICE_URLS = {
    "sqlite": None,
    "postgres": databases.url("postgres"),
    "mysql": databases.url("mysql"),
}


def pytest_sessionstart(session: pytest.Session) -> None:
    databases.create()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    databases.drop()


def require_service(name: str, host: str, port: int) -> None:
    """Skip when a service is unreachable here; fail under CI, where it must answer."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=2):
            return
    except OSError as exc:
        message = f"{name} at {host}:{port} is unreachable: {exc}"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)


_RESET_DONE: set[str] = set()


async def _reset_server_database(db: Database) -> None:
    """Once per session: drop everything and migrate; then per test: empty every table and
    restart its ids, as a TRUNCATE of them all would, touching only the tables the test wrote
    to (a row, or an id counter that moved). PostgreSQL deletes their rows (children first) and
    sets their sequences back: its TRUNCATE is DDL, about 0.7 s a test where this takes 0.07;
    MariaDB truncates them (about 0.5 s, every table's TRUNCATE about 1.5)."""
    from sqlalchemy import text

    from dueflow.store.schema import metadata

    if db.dialect not in _RESET_DONE:
        async with db.engine.begin() as conn:
            await conn.run_sync(metadata.drop_all)
            await conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
        await migrate.upgrade(db)
        _RESET_DONE.add(db.dialect)
    async with db.engine.begin() as conn:
        written = set((await conn.execute(text(_written_tables(db.dialect)))).scalars())
        tables = [t for t in reversed(metadata.sorted_tables) if t.name in written]
        if not tables:
            return
        if db.dialect == "postgresql":
            for table in tables:
                await conn.execute(table.delete())
                if (counter := table.autoincrement_column) is not None:
                    sequence = f"pg_get_serial_sequence('{table.name}', '{counter.name}')"
                    await conn.execute(text(f"SELECT setval({sequence}, 1, false)"))
        else:
            await conn.execute(text("SET FOREIGN_KEY_CHECKS = 0"))
            for table in tables:
                await conn.execute(text(f"TRUNCATE TABLE {table.name}"))
            await conn.execute(text("SET FOREIGN_KEY_CHECKS = 1"))


def _written_tables(dialect: str) -> str:
    """One query naming every table of ``metadata`` that holds a row or whose id counter has
    moved since it was last truncated (an insert rolled back moves it too)."""
    from dueflow.store.schema import metadata

    parts = []
    for table in metadata.sorted_tables:
        name, counter = table.name, table.autoincrement_column
        moved = ""
        if dialect == "postgresql" and counter is not None:
            sequence = f"pg_get_serial_sequence('{name}', '{counter.name}')::regclass"
            moved = f" OR pg_sequence_last_value({sequence}) IS NOT NULL"
        parts.append(
            f"SELECT '{name}' FROM (SELECT 1) AS one WHERE EXISTS (SELECT 1 FROM {name}){moved}"
        )
    if dialect != "postgresql":
        parts.append(
            "SELECT TABLE_NAME FROM information_schema.TABLES"
            " WHERE TABLE_SCHEMA = DATABASE() AND AUTO_INCREMENT > 1"
        )
    return " UNION ".join(parts)


@pytest.fixture(
    params=[
        pytest.param("sqlite"),
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def backend_url(request: pytest.FixtureRequest, db_path: Path) -> str:
    """A database URL per backend, empty and migrated: SQLite file, PostgreSQL, MariaDB."""
    name = request.param
    if name == "sqlite":
        return f"sqlite:///{db_path}"
    url = SERVICE_URLS[name]
    assert url is not None
    require_service(name, "127.0.0.1", 5432 if name == "postgres" else 3306)
    return url


@pytest.fixture
async def backend_world(backend_url: str) -> AsyncIterator[World]:
    """The ``world`` of the unit tests, on each backend in turn."""
    async for built in world_at(backend_url):
        yield built


async def world_at(url: str) -> AsyncIterator[World]:
    """A :class:`World` on the database at ``url``; a server database emptied and migrated."""
    clock = FakeClock(START)
    notifier = RecordingNotifier()
    settings = load_settings(database_url=url, profile="prod")
    async with bootstrap.running(
        settings, clock=clock, notifier=notifier, migrate_sqlite=False
    ) as deps:
        if deps.db.dialect != "sqlite":
            await _reset_server_database(deps.db)
        seller, _ = await accounts.add_user(deps, "seller")
        buyer, _ = await accounts.add_user(deps, "buyer")
        other, _ = await accounts.add_user(deps, "other")
        yield World(deps, clock, notifier, Worker(deps), seller.id, buyer.id, other.id)


@contextlib.contextmanager
def http_receiver(on_post: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """A real HTTP server on a free loopback port, in a thread, calling ``on_post(handler)``
    for each POST (it reads the body and answers); yields its URL (``/hooks/dueflow``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            on_post(self)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    host, port = server.server_address[:2]
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{port}/hooks/dueflow"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
