"""Shared fixtures: a migrated SQLite file per test, a controllable clock, wired dependencies."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dueflow import bootstrap
from dueflow.clock import FakeClock
from dueflow.config import Settings, load_settings
from dueflow.notifiers.base import Notifier, Reminder
from dueflow.service import accounts
from dueflow.service.deps import Deps
from dueflow.store import migrate
from dueflow.store.db import Database
from dueflow.worker.runner import Worker

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
def settings(db_path: Path) -> Settings:
    return load_settings(database_url=f"sqlite:///{db_path}", profile="prod")


@pytest.fixture
async def world(settings: Settings) -> AsyncIterator[World]:
    clock = FakeClock(START)
    notifier = RecordingNotifier()
    async with bootstrap.running(
        settings, clock=clock, notifier=notifier, migrate_sqlite=False
    ) as deps:
        seller, _ = await accounts.add_user(deps, "seller")
        buyer, _ = await accounts.add_user(deps, "buyer")
        other, _ = await accounts.add_user(deps, "other")
        yield World(deps, clock, notifier, Worker(deps), seller.id, buyer.id, other.id)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"
