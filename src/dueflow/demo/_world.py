"""The demos' world in fast time: dueflow on the dev profile with the payment simulator wired
both ways (its notifications reach dueflow's API in process), and a worker with its scanner.

Private to :mod:`dueflow.demo.marketplace`, which re-exports :func:`fast_world`,
:class:`FastWorld` and :func:`worker_running` for every demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from dueflow import bootstrap
from dueflow.api.app import create_app as create_api
from dueflow.clock import ScaledClock
from dueflow.config import load_settings
from dueflow.notifiers.log import LogNotifier
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as create_simulator
from dueflow.payments.simulator.app import simulator_of
from dueflow.service.deps import Deps
from dueflow.worker.runner import Worker
from dueflow.worker.scanner import run_scanner


@dataclass
class FastWorld:
    """dueflow on the dev profile in fast time, with the payment simulator wired both ways."""

    deps: Deps
    notifier: LogNotifier
    #: The simulator's control API (scan, pay, ...).
    sim: httpx.AsyncClient


@contextlib.asynccontextmanager
async def fast_world(*, speed: float, db: Path | None) -> AsyncIterator[FastWorld]:
    """dueflow at ``speed`` simulated seconds a real second on the SQLite file ``db`` (a fresh
    temporary one without it), the simulator notifying its API in process."""
    # Late payments are logged loudly as discrepancies; the demo reports them in its tables.
    logging.getLogger("dueflow").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="dueflow-demo-") as tmp:
        path = db or Path(tmp) / "demo.db"
        clock = ScaledClock(speed=speed)
        to_dueflow = _LateASGI()
        sim_config = SimulatorConfig.generate(clock=clock, transport=to_dueflow)
        sim_app = create_simulator(sim_config)
        settings = load_settings(
            database_url=f"sqlite:///{path}",
            profile="dev",
            scan_interval="60s",
            scan_grace="30s",
            public_url="http://dueflow",
            **dataclasses.asdict(sim_config.client_config("http://sim")),
        )
        notifier = LogNotifier()
        async with (
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=sim_app), base_url="http://sim"
            ) as sim,
            bootstrap.running(settings, clock=clock, notifier=notifier, http=sim) as deps,
            simulator_of(sim_app).running(),
        ):
            to_dueflow.app = create_api(deps)
            yield FastWorld(deps, notifier, sim)


@contextlib.asynccontextmanager
async def worker_running(deps: Deps) -> AsyncIterator[None]:
    """A worker and its scanner beside the simulated people, stopped on the way out."""
    stop = asyncio.Event()
    worker = Worker(deps)
    background = [
        asyncio.create_task(worker.run(stop)),
        asyncio.create_task(run_scanner(worker, stop)),
    ]
    try:
        yield
    finally:
        stop.set()
        deps.trigger.wake()
        await asyncio.gather(*background)


class _LateASGI(httpx.AsyncBaseTransport):
    """The simulator's way to dueflow's notify routes, an app that exists only once wired."""

    def __init__(self) -> None:
        self.app: Any = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await httpx.ASGITransport(app=self.app).handle_async_request(request)
