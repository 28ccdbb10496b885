"""``dueflow serve``: the HTTP app, the worker, the scanner and the feeder in one process."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn
from rich.console import Console

from dueflow import bootstrap
from dueflow.api.app import create_app
from dueflow.config import Settings, load_settings
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as create_simulator
from dueflow.payments.simulator.app import simulator_of
from dueflow.worker.runner import Worker, run_feeder
from dueflow.worker.scanner import run_scanner


def wants_simulator(settings: Settings) -> bool:
    """The dev profile with no real provider configured gets the simulator at /sim."""
    return settings.profile == "dev" and not (
        settings.alipay_gateway_url or settings.wechatpay_base_url
    )


def with_simulator(settings: Settings, base_url: str) -> tuple[Settings, SimulatorConfig]:
    """Settings that point the providers at a fresh simulator served under ``base_url``/sim."""
    config = SimulatorConfig.generate()
    keys = dataclasses.asdict(config.client_config(f"{base_url}/sim"))
    values = {**settings.model_dump(), **keys, "public_url": base_url}
    return load_settings(**values), config


async def serve(
    settings: Settings, *, host: str, port: int, worker: bool, console: Console
) -> None:
    """Serve until SIGINT or SIGTERM; a batch in progress is finished before the process ends."""
    base_url = f"http://{host}:{port}"
    simulator: SimulatorConfig | None = None
    if wants_simulator(settings):
        settings, simulator = with_simulator(settings, base_url)
    async with bootstrap.running(settings) as deps:
        app = create_app(deps)
        async with _simulator_mounted(app, simulator):
            stop = asyncio.Event()
            tasks: list[asyncio.Task[Any]] = []
            if worker:
                runner = Worker(deps)
                tasks = [
                    asyncio.create_task(runner.run(stop)),
                    asyncio.create_task(run_scanner(runner, stop)),
                    asyncio.create_task(run_feeder(runner, stop)),
                ]
            console.print(f"dueflow serving on {base_url} (worker {'on' if worker else 'off'})")
            if simulator is not None:
                console.print(
                    f"payment simulator at {base_url}/sim (keys: {base_url}/sim/control/keys)"
                )
            server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, server.stop)
            try:
                await server.serve()
            finally:
                stop.set()
                deps.trigger.wake()
                await asyncio.gather(*tasks, return_exceptions=True)
                console.print("dueflow stopped")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: dueflow stops it, then finishes the worker's
    batch in progress and exits 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def stop(self) -> None:
        """Begin a graceful shutdown."""
        self.should_exit = True


@contextlib.asynccontextmanager
async def _simulator_mounted(app: Any, config: SimulatorConfig | None) -> AsyncIterator[None]:
    if config is None:
        yield
        return
    sim_app = create_simulator(config)
    app.mount("/sim", sim_app)
    async with simulator_of(sim_app).running():
        yield
