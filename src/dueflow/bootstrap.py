"""The one place where adapters are chosen from settings and wired together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode

from dueflow import redis_url, tracing
from dueflow.clock import Clock, DatabaseClock, SystemClock
from dueflow.config import Settings
from dueflow.exceptions import ConfigError
from dueflow.locks.base import Bypasses, Locks, NoLocks
from dueflow.metrics.prometheus import Metrics
from dueflow.notifiers.base import Notifier
from dueflow.notifiers.log import LogNotifier
from dueflow.payments.base import PaymentProvider, Providers
from dueflow.payments.manual import ManualProvider
from dueflow.seatcache.base import NoSeatCache, SeatCache
from dueflow.service.deps import Deps
from dueflow.store import migrate, servertime
from dueflow.store.db import Database
from dueflow.store.holds import Holds
from dueflow.timers import registry

if TYPE_CHECKING:  # the adapters below are imported when the settings choose them
    import httpx

    from dueflow.notifiers.event_webhook import EventWebhook

log = logging.getLogger(__name__)
#: How often a process re-measures its offset from the database's clock.
CLOCK_RESYNC = timedelta(seconds=30)
#: Seconds between tries while the database's clock has never been read.
SYNC_RETRY = 1.0


def build_notifier(settings: Settings) -> Notifier:
    """The notifier the settings ask for."""
    if settings.notifier == "webhook":
        if not settings.notifier_url:
            raise ConfigError("DUEFLOW_NOTIFIER=webhook needs DUEFLOW_NOTIFIER_URL")
        from dueflow.notifiers.webhook import WebhookNotifier

        return WebhookNotifier(
            url=settings.notifier_url,
            secret=settings.notifier_secret,
            timeout=settings.notifier_timeout.total_seconds(),
            max_deliveries=settings.notifier_max_deliveries,
        )
    return LogNotifier()


def build_event_webhook(
    settings: Settings, *, client: httpx.AsyncClient | None = None
) -> EventWebhook:
    """What the worker's processes send events with: to the endpoints made over the API and,
    when ``DUEFLOW_EVENTS_WEBHOOK_URL`` is set, to that one too, signing with
    ``DUEFLOW_EVENTS_WEBHOOK_SECRET`` (required with the URL)."""
    from dueflow.notifiers.event_webhook import EventWebhook

    return EventWebhook(
        url=settings.events_webhook_url,
        secret=settings.events_webhook_secret,
        client=client,
        allow_private=settings.webhook_allow_private,
    )


ALIPAY_SETTINGS = ("app_id", "seller_id", "app_private_key", "public_key")
WECHATPAY_SETTINGS = (
    "appid",
    "mchid",
    "merchant_serial",
    "merchant_private_key",
    "public_key_id",
    "public_key",
    "api_v3_key",
)


def _configured(settings: Settings, provider: str, names: tuple[str, ...]) -> dict[str, str] | None:
    """The provider's settings when its URL is set; ConfigError when some are missing."""
    url = getattr(settings, f"{provider}_{'gateway_url' if provider == 'alipay' else 'base_url'}")
    if not url:
        return None
    values = {name: getattr(settings, f"{provider}_{name}") for name in names}
    missing = [f"DUEFLOW_{provider}_{n}".upper() for n, v in values.items() if not v]
    if missing:
        raise ConfigError(f"{provider} is configured but these are missing: {', '.join(missing)}")
    return {"url": url, **values}


def build_providers(
    settings: Settings, *, client: httpx.AsyncClient | None = None, clock: Clock | None = None
) -> Providers:
    """The manual provider, and Alipay and WeChat Pay where their settings are given."""
    providers: list[PaymentProvider] = [ManualProvider()]
    notify = settings.public_url.rstrip("/") + "/notify"
    alipay = _configured(settings, "alipay", ALIPAY_SETTINGS)
    if alipay:
        from dueflow.payments.alipay.provider import AlipayProvider

        providers.append(
            AlipayProvider(
                gateway_url=alipay["url"],
                app_id=alipay["app_id"],
                seller_id=alipay["seller_id"],
                app_private_key=alipay["app_private_key"],
                alipay_public_key=alipay["public_key"],
                notify_url=f"{notify}/alipay",
                client=client,
            )
        )
    wechat = _configured(settings, "wechatpay", WECHATPAY_SETTINGS)
    if wechat:
        from dueflow.payments.wechatpay.provider import WechatPayProvider

        providers.append(
            WechatPayProvider(
                base_url=wechat["url"],
                appid=wechat["appid"],
                mchid=wechat["mchid"],
                merchant_serial=wechat["merchant_serial"],
                merchant_private_key=wechat["merchant_private_key"],
                platform_keys={wechat["public_key_id"]: wechat["public_key"]},
                api_v3_key=wechat["api_v3_key"],
                notify_url=f"{notify}/wechatpay",
                refund_notify_url=f"{notify}/wechatpay/refund",
                client=client,
                clock=clock,
            )
        )
    return Providers(providers)


def build_locks(settings: Settings, *, metrics: Metrics | None = None) -> Locks:
    """Redis locks when the trigger is Redis (or DUEFLOW_LOCKS_URL says where); otherwise the
    database's conditional updates and row locks decide alone. Locks skipped while Redis is
    unreachable are counted in ``metrics``."""
    url = settings.locks_url or (
        settings.trigger_url if redis_url.is_redis(settings.trigger_url) else None
    )
    if url is None:
        return NoLocks()
    from dueflow.locks.redis import RedisLocks

    counter = metrics.lock_bypassed if metrics is not None else None
    return RedisLocks.from_url(
        url.split("?", 1)[0], wait=settings.lock_wait, bypasses=Bypasses(counter)
    )


def build_seat_cache(settings: Settings, *, metrics: Metrics | None = None) -> SeatCache:
    """The Redis seat cache at ``DUEFLOW_SEAT_CACHE_URL``, else on the Redis of the locks or of
    a Redis trigger (with the trigger's key prefix, so two deployments sharing a Redis
    keep their shows apart); without Redis, none (the database answers every seat map)."""
    url = settings.seat_cache_url or settings.locks_url
    if url is None and redis_url.is_redis(settings.trigger_url):
        base, _, query = settings.trigger_url.partition("?")
        prefix = dict(parse_qsl(query)).get("prefix")
        url = f"{base}?{urlencode({'prefix': prefix})}" if prefix else base
    if url is None:
        return NoSeatCache()
    from dueflow.seatcache.redis import RedisSeatCache

    errors = metrics.seat_cache_errors if metrics is not None else None
    return RedisSeatCache.from_url(url, errors=errors)


def build(
    settings: Settings,
    *,
    clock: Clock | None = None,
    notifier: Notifier | None = None,
    http: httpx.AsyncClient | None = None,
) -> Deps:
    """Wire every adapter from ``settings``. Without a ``clock``, time is the database
    server's (:class:`~dueflow.clock.DatabaseClock`) where it has one, else this machine's.
    Tracing starts here when the ``OTEL_*`` variables ask for it (:func:`tracing.setup`)."""
    tracing.setup()
    db = Database.from_url(settings.database_url, sqlite_synchronous=settings.sqlite_synchronous)
    if clock is None:
        clock = (
            DatabaseClock(lambda: servertime.server_now(db))
            if servertime.has_clock(db)
            else SystemClock()
        )
    metrics = Metrics()
    metrics.count_statements(db)
    seat_cache = build_seat_cache(settings, metrics=metrics)
    return Deps(
        db=db,
        clock=clock,
        policy=settings.deadline_policy(),
        providers=build_providers(settings, client=http, clock=clock),
        notifier=notifier or build_notifier(settings),
        trigger=registry.from_url(settings.trigger_url, clock=clock),
        locks=build_locks(settings, metrics=metrics),
        seat_cache=seat_cache,
        holds=Holds.build(seat_cache=seat_cache),
        metrics=metrics,
        lock_ttl=settings.lock_ttl,
        batch_size=settings.batch_size,
        max_batch_size=settings.max_batch_size,
        lease=settings.lease,
        max_idle=settings.max_idle,
        scan_interval=settings.scan_interval,
        scan_grace=settings.scan_grace,
        seat_reconcile_interval=settings.seat_reconcile_interval,
        provider_concurrency=settings.provider_concurrency,
        worker_batches=settings.worker_batches,
        timer_max_attempts=settings.timer_max_attempts,
        webhook_allow_private=settings.webhook_allow_private,
    )


@asynccontextmanager
async def running(
    settings: Settings,
    *,
    clock: Clock | None = None,
    notifier: Notifier | None = None,
    migrate_sqlite: bool = True,
    http: httpx.AsyncClient | None = None,
) -> AsyncIterator[Deps]:
    """Wired dependencies, closed on exit. An SQLite database is migrated on the way in.
    ``http`` is the client providers use (tests pass one bound to the simulator)."""
    deps = build(settings, clock=clock, notifier=notifier, http=http)
    keep_time = None
    try:
        if migrate_sqlite and deps.db.dialect == "sqlite":
            await migrate.upgrade(deps.db)
        if isinstance(deps.clock, DatabaseClock):
            await _sync(deps.clock)
            keep_time = asyncio.create_task(_keep_in_sync(deps.clock, CLOCK_RESYNC))
        yield deps
    finally:
        if keep_time is not None:
            keep_time.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keep_time
        await deps.trigger.close()
        await deps.notifier.close()
        await deps.locks.close()
        await deps.seat_cache.close()
        await deps.providers.aclose()
        await deps.db.dispose()


async def _sync(clock: DatabaseClock) -> None:
    try:
        offset = await clock.sync()
    except Exception as exc:
        # A database that is down now is retried by the next sync; until one succeeds the
        # offset stays as it was (zero at the start: this machine's clock).
        log.warning("could not read the database's clock (%s); retrying", type(exc).__name__)
        return
    if abs(offset) > timedelta(seconds=1):
        log.warning("this machine's clock is %.3f s off the database's", -offset.total_seconds())


async def _keep_in_sync(clock: DatabaseClock, every: timedelta) -> None:
    """Re-measure the clock's offset every ``every`` (in real seconds) while the process runs;
    every second until a first measurement has succeeded (the database was down at start)."""
    while True:
        await asyncio.sleep(every.total_seconds() if clock.synced else SYNC_RETRY)
        await _sync(clock)
