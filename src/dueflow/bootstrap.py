"""The one place where adapters are chosen from settings and wired together."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from dueflow.clock import Clock, SystemClock
from dueflow.config import Settings
from dueflow.exceptions import ConfigError
from dueflow.locks import Locks, NoLocks, RedisLocks
from dueflow.notifiers.base import Notifier
from dueflow.notifiers.log import LogNotifier
from dueflow.notifiers.webhook import WebhookNotifier
from dueflow.payments.base import Providers
from dueflow.payments.manual import ManualProvider
from dueflow.service.deps import Deps
from dueflow.store import migrate
from dueflow.store.db import Database
from dueflow.timers import registry


def build_notifier(settings: Settings) -> Notifier:
    """The notifier the settings ask for."""
    if settings.notifier == "webhook":
        if not settings.notifier_url:
            raise ConfigError("DUEFLOW_NOTIFIER=webhook needs DUEFLOW_NOTIFIER_URL")
        return WebhookNotifier(
            url=settings.notifier_url,
            secret=settings.notifier_secret,
            timeout=settings.notifier_timeout.total_seconds(),
        )
    return LogNotifier()


def build_locks(settings: Settings) -> Locks:
    """Redis locks when the trigger is Redis (or DUEFLOW_LOCKS_URL says where); otherwise the
    database's conditional updates and row locks decide alone."""
    url = settings.locks_url or (
        settings.trigger_url if settings.trigger_url.startswith(("redis://", "rediss://")) else None
    )
    if url is None:
        return NoLocks()
    return RedisLocks.from_url(url.split("?", 1)[0])


def build(
    settings: Settings, *, clock: Clock | None = None, notifier: Notifier | None = None
) -> Deps:
    """Wire every adapter from ``settings``."""
    clock = clock or SystemClock()
    return Deps(
        db=Database.from_url(settings.database_url),
        clock=clock,
        policy=settings.deadline_policy(),
        providers=Providers([ManualProvider()]),
        notifier=notifier or build_notifier(settings),
        trigger=registry.from_url(settings.trigger_url, clock=clock),
        locks=build_locks(settings),
        lock_ttl=settings.lock_ttl,
        batch_size=settings.batch_size,
        max_batch_size=settings.max_batch_size,
        lease=settings.lease,
        max_idle=settings.max_idle,
        scan_interval=settings.scan_interval,
        scan_grace=settings.scan_grace,
        provider_concurrency=settings.provider_concurrency,
    )


@asynccontextmanager
async def running(
    settings: Settings,
    *,
    clock: Clock | None = None,
    notifier: Notifier | None = None,
    migrate_sqlite: bool = True,
) -> AsyncIterator[Deps]:
    """Wired dependencies, closed on exit. An SQLite database is migrated on the way in."""
    deps = build(settings, clock=clock, notifier=notifier)
    try:
        if migrate_sqlite and deps.db.dialect == "sqlite":
            await migrate.upgrade(deps.db)
        yield deps
    finally:
        await deps.trigger.close()
        await deps.notifier.close()
        await deps.locks.close()
        await deps.db.dispose()
