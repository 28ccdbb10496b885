"""The one harness of the real races (tests/contract/test_races.py, test_seat_races.py,
test_shop_races.py, test_shop_pay_races.py).

Contenders run as several "processes": each a thread with its own event loop and its own Deps
(engine, pool, seat cache, locks), released together by a ``threading.Barrier``; inside a
process its contenders start together with ``asyncio.gather``, each on a pool connection of its
own. Clocks are FakeClocks set to one instant, never a sleep: a head start (real seconds, for the
order of arrival only) is the one wait. :func:`contend` gives every contender a process of its
own and runs rounds; :func:`race` deals one round's contenders over a few processes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select

from dueflow import bootstrap
from dueflow.clock import FakeClock
from dueflow.config import Settings, load_settings
from dueflow.service import accounts
from dueflow.service.deps import Deps

JOIN_SECONDS = 120
HEAD_START = 0.02  # real seconds one contender goes first by (arrival order, never a deadline)

#: One contender of :func:`race`: what one process calls.
Body = Callable[[Deps], Awaitable[Any]]
#: One contender of :func:`contend`: what one process calls in round ``round_no``.
RoundBody = Callable[[Deps, int], Awaitable[Any]]


@dataclass
class Outcome:
    """What one contender's call returned or raised (in one round)."""

    value: Any = None
    error: BaseException | None = None


def run(
    settings: Settings,
    now: datetime,
    bodies: Sequence[RoundBody],
    *,
    processes: int,
    rounds: int = 1,
    head_start: Callable[[int, int], float] = lambda _round, _index: 0.0,
) -> list[list[Outcome]]:
    """Run ``bodies`` dealt round-robin over ``processes`` threads (each its own event loop and
    Deps, connected before the race); every round all processes are released together by a
    barrier and body ``index`` waits ``head_start(round, index)`` seconds before its call.
    Returns outcomes[round][index]."""
    processes = min(processes, len(bodies))
    results = [[Outcome() for _ in bodies] for _ in range(rounds)]
    barrier = threading.Barrier(processes)
    crashes: list[BaseException] = []

    async def contender(deps: Deps, round_no: int, index: int) -> None:
        if delay := head_start(round_no, index):
            await asyncio.sleep(delay)
        try:
            results[round_no][index].value = await bodies[index](deps, round_no)
        except Exception as exc:
            results[round_no][index].error = exc

    async def process(mine: list[int]) -> None:
        async with bootstrap.running(settings, clock=FakeClock(now), migrate_sqlite=False) as deps:
            async with deps.db.read() as conn:  # connect before the race, not in it
                await conn.execute(select(1))
            for round_no in range(rounds):
                await asyncio.to_thread(barrier.wait, JOIN_SECONDS)
                await asyncio.gather(*(contender(deps, round_no, i) for i in mine))

    def thread(mine: list[int]) -> None:
        try:
            asyncio.run(process(mine))
        except BaseException as exc:  # reported below, never as an unhandled thread error
            crashes.append(exc)
            barrier.abort()

    threads = [
        threading.Thread(
            target=thread,
            args=(list(range(p, len(bodies), processes)),),
            name=f"contender-{p}",
            daemon=True,
        )
        for p in range(processes)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_SECONDS)
    assert not any(t.is_alive() for t in threads), "a contender hung"
    assert not crashes, f"a contender crashed: {crashes!r}"
    return results


def contend(
    settings: Settings,
    now: datetime,
    bodies: Sequence[RoundBody],
    *,
    rounds: int = 1,
    stagger: float = 0.0,
) -> list[list[Outcome]]:
    """Run each body in its own process; for every round all bodies are released together.
    Returns outcomes[round][contender].

    With ``stagger``, every odd round gives one contender (each in turn) a head start of that
    many seconds over the others, so that every order of arrival is seen, not only the one the
    fastest code path wins; even rounds stay truly simultaneous."""

    def head_start(round_no: int, index: int) -> float:
        if stagger and round_no % 2 and index != (round_no // 2) % len(bodies):
            return stagger
        return 0.0

    return run(settings, now, bodies, processes=len(bodies), rounds=rounds, head_start=head_start)


def race(
    url: str,
    now: datetime,
    bodies: Sequence[Body],
    *,
    processes: int,
    first: int | None = None,
) -> list[Outcome]:
    """Run ``bodies`` at once, dealt round-robin over ``processes`` processes on the database
    at ``url``; returns each body's outcome, in order. With ``first``, that body starts
    :data:`HEAD_START` seconds before the others."""

    def head_start(_round: int, index: int) -> float:
        return HEAD_START if first is not None and index != first else 0.0

    def of_round(body: Body) -> RoundBody:
        return lambda deps, _round: body(deps)

    settings = load_settings(database_url=url, profile="prod")
    (outcomes,) = run(
        settings, now, [of_round(b) for b in bodies], processes=processes, head_start=head_start
    )
    return outcomes


# --- reading the database and making people ---------------------------------------------------


async def rows(deps: Deps, query: Any) -> list[Any]:
    async with deps.db.read() as conn:
        return list((await conn.execute(query)).all())


async def buyers(world: Any, n: int, prefix: str) -> list[int]:
    return [(await accounts.add_user(world.deps, f"{prefix}{i}"))[0].id for i in range(n)]
