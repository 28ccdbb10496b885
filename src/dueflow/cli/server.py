"""What serves ``dueflow serve``'s HTTP app in a process: the listening sockets, uvicorn on
uvloop and httptools over the running loop, the worker, the scanner and the feeder beside the app
(:class:`Background`), the payment simulator at /sim in the dev profile, and the dev users'
tokens. :func:`serve_here` is the whole server in one process; :mod:`dueflow.cli.supervisor`
uses the same pieces for ``--workers N``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn
import uvloop
from rich.console import Console

from dueflow import bootstrap
from dueflow.api.app import create_app
from dueflow.config import Settings, load_settings
from dueflow.exceptions import ConfigError
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as create_simulator
from dueflow.payments.simulator.app import simulator_of
from dueflow.service import accounts, webhooks
from dueflow.service.deps import Deps
from dueflow.worker import reconciler
from dueflow.worker.runner import Worker, run_feeder
from dueflow.worker.scanner import run_scanner

#: The HTTP/1.1 parser every API process uses (uvicorn's fastest; h11 is its pure-Python one).
HTTP = "httptools"
#: Connections the kernel queues on the port before an API process accepts them.
BACKLOG = 2048

#: What ``dueflow serve`` runs its event loops on (the parent's and every API process's).
new_event_loop = uvloop.new_event_loop


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


def listen(host: str, port: int, count: int = 1) -> list[socket.socket]:
    """The listening sockets of ``dueflow serve``: one, or ``count`` on the same port with
    SO_REUSEPORT (one per API process).

    Raises:
        ConfigError: the address cannot be listened on (in use, not this machine's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # "::", "::1" are IPv6
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(
                socket.create_server(
                    (host, port), family=family, backlog=BACKLOG, reuse_port=count > 1
                )
            )
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sockets


@dataclasses.dataclass(frozen=True)
class Options:
    """What the command line asked of ``dueflow serve``."""

    base_url: str
    worker: bool
    workers: int
    dev_users: bool
    verbose: bool
    console: Console


def stop_on_signals() -> asyncio.Event:
    """An event set by the first SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def api_app(deps: Deps, settings: Settings) -> Any:
    """The FastAPI app over ``deps``, its admin sessions as the settings say."""
    return create_app(
        deps,
        session_secret=settings.session_secret,
        session_ttl=settings.session_ttl,
        secure_cookies=settings.public_url.startswith("https://"),
    )


def uvicorn_server(app: Any) -> Server:
    """uvicorn over the running loop (``loop="none"``: it creates none), parsing with
    httptools; its access log off (the app writes one of its own, ``dueflow.access``)."""
    config = uvicorn.Config(
        app, http=HTTP, loop="none", backlog=BACKLOG, log_level="warning", access_log=False
    )
    return Server(config)


def implementation(server: Server) -> str:
    """The event loop and HTTP parser this process really runs: ``uvloop, httptools``."""
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    protocol = server.config.http_protocol_class.__module__.rsplit(".", 1)[-1]
    return f"{loop}, {protocol.removesuffix('_impl')}"


class Background:
    """The worker, the scanner, the feeder, the reconciler and the event sender of this process
    (none of them when ``on`` is false)."""

    def __init__(self, deps: Deps, settings: Settings, *, on: bool) -> None:
        self.deps = deps
        self.halt = asyncio.Event()
        self.tasks: list[asyncio.Task[Any]] = []
        if on:
            runner = Worker(deps)
            self.tasks = [
                asyncio.create_task(runner.run(self.halt)),
                asyncio.create_task(run_scanner(runner, self.halt)),
                asyncio.create_task(run_feeder(runner, self.halt)),
            ]
            self.tasks += reconciler.start(deps, self.halt)
            self.tasks += webhooks.start(deps, bootstrap.build_event_webhook(settings), self.halt)

    async def stop(self) -> None:
        """Stop every task; the batch in progress is finished first."""
        self.halt.set()
        self.deps.trigger.wake()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def serve_here(
    deps: Deps,
    settings: Settings,
    sock: socket.socket,
    stop: asyncio.Event,
    options: Options,
    simulator: SimulatorConfig | None,
) -> None:
    """One process: the app and the worker on this loop."""
    app = api_app(deps, settings)
    async with _simulator_mounted(app, simulator):
        server = uvicorn_server(app)
        server.config.load()
        background = Background(deps, settings, on=options.worker)
        try:
            options.console.print(
                f"dueflow serving on {options.base_url} (worker "
                f"{'on' if options.worker else 'off'}, {implementation(server)})",
                soft_wrap=True,
            )
            if simulator is not None:
                options.console.print(
                    f"payment simulator at {options.base_url}/sim "
                    f"(keys: {options.base_url}/sim/control/keys)",
                    soft_wrap=True,
                )
            if options.dev_users:
                await print_dev_users(deps, options.base_url, options.console)
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            server.stop()
            await serving
        finally:
            await background.stop()
            options.console.print("dueflow stopped")


class Server(uvicorn.Server):
    """uvicorn without its own signal handling: dueflow stops it, then finishes the worker's
    batch in progress and exits 0."""

    on_started: Any = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.on_started is not None:
            self.on_started()

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


async def print_dev_users(deps: Deps, base_url: str, console: Console) -> None:
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
