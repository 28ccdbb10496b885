"""The chaos driver: faults at random moments of a leg, each one bounded in time, each recorded
with the moment it was injected.

The kinds (those that apply to the leg's fleet):

* ``sigkill_worker``: a worker is SIGKILLed in the middle of whatever it does and restarted a
  moment later; its claims come back through the scanner once their lease runs out.
* ``restart_api``: an API process is stopped (SIGTERM or SIGKILL, in turn) and started again;
  the load generator goes to the other one meanwhile.
* ``flushall_redis``: FLUSHALL: the Redis trigger's schedule, the locks and the seat cache are
  gone at once.
* ``restart_redis``: the leg's own ``redis-server`` is shut down without saving
  (``SHUTDOWN NOSAVE``) and started again on its port :data:`REDIS_DOWN` seconds later, empty:
  the trigger's schedule is lost and every process's Redis calls fail meanwhile.
* ``purge_rabbitmq``: every queue of the RabbitMQ trigger is purged.
* ``terminate_db_connections``: ``pg_terminate_backend`` on every connection of the leg's
  database.
* ``restart_postgres``: PostgreSQL goes away for :data:`PG_DOWN` seconds as the leg's processes
  see it: the proxy they reach it through breaks every connection and refuses new ones, then
  listens again (the shared server itself is never stopped: other runs may be using it).
* ``sigstop_worker``: a worker is frozen past its lease, then resumed: it wakes up holding
  claims the scanner has handed to others.
* ``clock_fast_worker``: one worker runs its whole life with its wall clock 30 s ahead
  (recorded once, at the start).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from tests.soak.fleet import Fleet, Proc

Fault = Callable[["Chaos"], Awaitable[str]]
#: Seconds a restarted Redis stays down (the review's reproduction: 3 s).
REDIS_DOWN = 3.0
#: Seconds a restarted PostgreSQL stays away.
PG_DOWN = 3.0


@dataclass
class Chaos:
    """Injects faults into one fleet on a schedule; ``faults`` records what it did."""

    fleet: Fleet
    rng: random.Random
    #: How long a frozen worker stays frozen (past the lease).
    freeze_seconds: float
    faults: list[dict[str, Any]] = field(default_factory=list)
    _turn: int = 0

    def kinds(self) -> list[str]:
        """The fault kinds that apply to this fleet."""
        config = self.fleet.config
        kinds = ["restart_api"]
        if self.fleet.workers:
            kinds += ["sigkill_worker", "sigstop_worker"]
        elif config.sqlite:
            kinds += ["sigstop_worker"]  # the one process is the worker
        if config.redis_url or config.trigger_url.startswith("redis"):
            kinds.append("flushall_redis")
        if self.fleet.redis is not None:
            kinds.append("restart_redis")
        if config.trigger_url.startswith("amqp"):
            kinds.append("purge_rabbitmq")
        if config.database_url.startswith("postgresql"):
            kinds.append("terminate_db_connections")
        if self.fleet.pg_proxy is not None:
            kinds.append("restart_postgres")
        return kinds

    def schedule(self, count: int, seconds: float, apart: float) -> list[tuple[float, str]]:
        """``count`` faults over ``seconds``: every kind at least once, the rest at random,
        spread evenly with jitter after the first tenth of the time (the load is running), each
        at least ``apart`` seconds after the end of the one before (a frozen worker's fault ends
        when it is resumed), so the lateness each fault causes is its own, not a pile-up."""
        kinds = self.kinds()
        picks = list(kinds) + [self.rng.choice(kinds) for _ in range(max(0, count - len(kinds)))]
        self.rng.shuffle(picks)
        step = seconds * 0.85 / max(1, len(picks))
        plan: list[tuple[float, str]] = []
        ready = seconds * 0.1
        for i, kind in enumerate(picks):
            at = max(ready, seconds * 0.1 + i * step + self.rng.uniform(0, step * 0.3))
            plan.append((at, kind))
            ready = at + apart + (self.freeze_seconds if kind == "sigstop_worker" else 0)
        return plan

    def record(self, kind: str, detail: str, at: datetime | None = None) -> None:
        """Note a fault as injected at ``at`` (now by default)."""
        when = (at or datetime.now(UTC)).isoformat()
        self.faults.append({"at": when, "kind": kind, "detail": detail})

    async def run(self, plan: list[tuple[float, str]], stop: asyncio.Event) -> None:
        """Inject ``plan`` (seconds from now, kind) until done or ``stop``."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        worker = next((w for w in self.fleet.workers if "clock+" in w.name), None)
        if worker is not None:
            self.record("clock_fast_worker", f"{worker.name} (pid {worker.pid}) runs 30 s ahead")
        for at, kind in plan:
            delay = at - (loop.time() - t0)
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                    return
                except TimeoutError:
                    pass
            if stop.is_set():
                return
            at = datetime.now(UTC)
            detail = await FAULTS[kind](self)
            self.record(kind, detail, at)

    def pick(self, procs: list[Proc]) -> Proc:
        """A random running process of ``procs`` (the first if none runs)."""
        running = [p for p in procs if p.alive]
        return self.rng.choice(running or procs)


async def sigkill_worker(chaos: Chaos) -> str:
    """SIGKILL a worker; start it again after a second or two."""
    worker = chaos.pick(chaos.fleet.workers)
    pid = worker.pid
    await asyncio.to_thread(worker.kill)
    await asyncio.sleep(chaos.rng.uniform(1, 2))
    await asyncio.to_thread(worker.start)
    return f"{worker.name} pid {pid} killed, restarted as pid {worker.pid}"


async def restart_api(chaos: Chaos) -> str:
    """Stop an API process (SIGTERM, or SIGKILL every other time) and start it again."""
    api = chaos.pick(chaos.fleet.apis)
    pid = api.pid
    chaos._turn += 1
    how = "SIGKILL" if chaos._turn % 2 == 0 else "SIGTERM"
    if how == "SIGKILL":
        await asyncio.to_thread(api.kill)
    else:
        await asyncio.to_thread(api.stop)
    await asyncio.to_thread(api.start)
    return f"{api.name} pid {pid} stopped by {how}, restarted as pid {api.pid}"


async def flushall_redis(chaos: Chaos) -> str:
    """FLUSHALL the Redis server the leg uses."""
    import redis.asyncio as aioredis

    config = chaos.fleet.config
    url = chaos.fleet.on_own_redis(config.redis_url or config.trigger_url)
    parts = urlsplit(url)
    client = aioredis.Redis(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 6379,
        db=int(parts.path.strip("/") or 0),
    )
    try:
        keys = await client.dbsize()
        await client.flushall()
    finally:
        await client.aclose()
    return f"FLUSHALL ({keys} keys in the leg's database {parts.path.strip('/') or 0})"


async def restart_redis(chaos: Chaos) -> str:
    """``SHUTDOWN NOSAVE`` the leg's own ``redis-server``; start it again on its port after
    :data:`REDIS_DOWN` seconds, empty."""
    import redis.asyncio as aioredis
    from redis.exceptions import ConnectionError as RedisConnectionError

    server = chaos.fleet.redis
    assert server is not None and server.popen is not None
    pid = server.pid
    client = aioredis.Redis(port=chaos.fleet.redis_port)
    try:
        keys = await client.dbsize()
        with contextlib.suppress(RedisConnectionError):  # closed by the server going down
            await client.shutdown(nosave=True)
    finally:
        await client.aclose()
    await asyncio.to_thread(server.popen.wait, 30)
    await asyncio.sleep(REDIS_DOWN)
    await asyncio.to_thread(server.start)
    return (
        f"redis-server pid {pid} shut down without saving ({keys} keys), down "
        f"{REDIS_DOWN:.0f} s, restarted empty as pid {server.pid}"
    )


async def purge_rabbitmq(chaos: Chaos) -> str:
    """Purge every queue of the leg's RabbitMQ trigger."""
    import aio_pika

    from dueflow.timers.rabbitmq import RabbitTrigger

    trigger = RabbitTrigger.from_url(chaos.fleet.config.trigger_url)
    connection = await aio_pika.connect(trigger.url, timeout=10)
    purged = 0
    try:
        channel = await connection.channel()
        for name in trigger.queue_names:
            try:
                queue = await channel.declare_queue(name, passive=True)
            except aio_pika.exceptions.ChannelClosed:
                channel = await connection.channel()  # not declared yet: nothing to purge
                continue
            done = await queue.purge()
            purged += int(getattr(done, "message_count", 0) or 0)
    finally:
        await connection.close()
    return f"purged {len(trigger.queue_names)} queues ({purged} messages)"


async def terminate_db_connections(chaos: Chaos) -> str:
    """``pg_terminate_backend`` on every other connection to the leg's database."""
    import asyncpg

    parts = urlsplit(chaos.fleet.config.database_url)
    database = parts.path.lstrip("/")
    conn = await asyncpg.connect(
        host=parts.hostname, port=parts.port or 5432, user=parts.username, database="postgres"
    )
    try:
        rows = await conn.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
    finally:
        await conn.close()
    return f"terminated {sum(1 for r in rows if r[0])} connections to {database}"


async def restart_postgres(chaos: Chaos) -> str:
    """Cut the leg's PostgreSQL proxy (every connection broken, new ones refused) for
    :data:`PG_DOWN` seconds, then let it listen again."""
    proxy = chaos.fleet.pg_proxy
    assert proxy is not None
    proxy.signal(signal.SIGUSR1)
    await asyncio.sleep(PG_DOWN)
    proxy.signal(signal.SIGUSR2)
    return f"PostgreSQL away {PG_DOWN:.0f} s (its proxy cut, then listening again)"


async def sigstop_worker(chaos: Chaos) -> str:
    """SIGSTOP a worker (on SQLite: the one process) past its lease, then SIGCONT."""
    procs = chaos.fleet.workers or chaos.fleet.apis
    worker = chaos.pick(procs)
    worker.signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(chaos.freeze_seconds)
    finally:
        worker.signal(signal.SIGCONT)
    return f"{worker.name} pid {worker.pid} frozen {chaos.freeze_seconds:.0f} s, resumed"


FAULTS: dict[str, Fault] = {
    "sigkill_worker": sigkill_worker,
    "restart_api": restart_api,
    "flushall_redis": flushall_redis,
    "restart_redis": restart_redis,
    "purge_rabbitmq": purge_rabbitmq,
    "terminate_db_connections": terminate_db_connections,
    "restart_postgres": restart_postgres,
    "sigstop_worker": sigstop_worker,
}
