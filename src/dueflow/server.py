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
from dueflow.service import accounts, events
from dueflow.service.deps import Deps
from dueflow.store import migrate
from dueflow.worker import reconciler
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


DEV_USERS = (("admin", True), ("alice", False), ("bob", False))


async def serve(
    settings: Settings,
    *,
    host: str,
    port: int,
    worker: bool,
    console: Console,
    dev_users: bool = False,
) -> None:
    """Serve until SIGINT or SIGTERM; a batch in progress is finished before the process ends.

    Raises:
        NotMigrated: the server database's schema is not at the head revision (SQLite was
            migrated on the way in).
        BackendUnavailable: the database cannot be reached.
    """
    base_url = f"http://{host}:{port}"
    simulator: SimulatorConfig | None = None
    if wants_simulator(settings):
        settings, simulator = with_simulator(settings, base_url)
    async with bootstrap.running(settings) as deps:
        await migrate.require_head(deps.db)
        app = create_app(
            deps,
            session_secret=settings.session_secret,
            session_ttl=settings.session_ttl,
            secure_cookies=settings.public_url.startswith("https://"),
        )
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
                tasks += reconciler.start(deps, stop)
                tasks += events.start(deps, bootstrap.build_event_webhook(settings), stop)
            console.print(f"dueflow serving on {base_url} (worker {'on' if worker else 'off'})")
            if simulator is not None:
                console.print(
                    f"payment simulator at {base_url}/sim (keys: {base_url}/sim/control/keys)",
                    soft_wrap=True,
                )
            if dev_users:
                await _print_dev_users(deps, base_url, console)
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


async def _print_dev_users(deps: Deps, base_url: str, console: Console) -> None:
    """Fresh tokens for an admin and two users, so a new machine can log in at once."""
    console.print(f"admin pages at {base_url}/admin   API docs at {base_url}/docs", soft_wrap=True)
    tokens = {}
    for name, admin in DEV_USERS:
        user, tokens[name] = await accounts.issue_token(deps, name, admin=admin)
        role = "admin" if admin else "user "
        console.print(f"  {role} {name:<6} (id {user.id})  token {tokens[name]}", highlight=False)
    console.print(
        f"  try: curl -H 'Authorization: Bearer {tokens['alice']}' -H 'Content-Type: "
        f'application/json\' -d \'{{"title": "kite", "price": "19.90"}}\' '
        f"{base_url}/api/goods",
        highlight=False,
        soft_wrap=True,
    )
