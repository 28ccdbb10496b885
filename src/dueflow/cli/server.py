"""``dueflow serve``: the HTTP app on uvloop and httptools, with the worker, the scanner and the
feeder beside it. ``--workers N`` (PostgreSQL and MySQL) runs the app in N processes sharing one
port, and the worker once, in the parent that supervises them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import os
import secrets
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import uvicorn
import uvloop
from rich.console import Console
from sqlalchemy.engine import make_url

from dueflow import bootstrap
from dueflow.api.app import create_app
from dueflow.config import Settings, load_settings
from dueflow.exceptions import ConfigError, DueflowError
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as create_simulator
from dueflow.payments.simulator.app import simulator_of
from dueflow.service import accounts, events
from dueflow.service.deps import Deps
from dueflow.store import migrate
from dueflow.store.db import async_url
from dueflow.worker import reconciler
from dueflow.worker.runner import Worker, run_feeder
from dueflow.worker.scanner import run_scanner

#: The HTTP/1.1 parser every API process uses (uvicorn's fastest; h11 is its pure-Python one).
HTTP = "httptools"
#: Connections the kernel queues on the port before an API process accepts them.
BACKLOG = 2048
#: Seconds the parent waits for an API process to finish its requests after SIGTERM; then
#: SIGKILL.
STOP_GRACE = 30.0

#: What ``dueflow serve`` runs its event loops on (the parent's and every API process's).
new_event_loop = uvloop.new_event_loop


class ApiProcessLost(DueflowError):
    """An API process ended while the server ran; the others were stopped."""


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


def refuse_workers(settings: Settings, workers: int) -> None:
    """Raise ConfigError where ``workers`` API processes cannot serve these settings."""
    if workers == 1:
        return
    if make_url(async_url(settings.database_url)).get_backend_name() == "sqlite":
        raise ConfigError(
            f"--workers {workers} needs PostgreSQL or MySQL: SQLite has one writer at a time, "
            "and dueflow's write queue orders the writers of one process only; more processes "
            "would wait on each other in SQLite's busy handler, slower than one. Serve SQLite "
            "with one process (--workers 1)."
        )
    if wants_simulator(settings):
        raise ConfigError(
            f"--workers {workers} cannot serve the payment simulator: it keeps its trades in "
            "one process's memory. Run `dueflow simulator` on its own and configure the "
            "provider settings from its /control/keys, use the prod profile, or serve one "
            "process."
        )


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
class _Options:
    """What the command line asked of ``dueflow serve``."""

    base_url: str
    worker: bool
    workers: int
    dev_users: bool
    verbose: bool
    console: Console


async def serve(
    settings: Settings,
    *,
    host: str,
    port: int,
    worker: bool,
    console: Console,
    dev_users: bool = False,
    workers: int = 1,
    verbose: bool = False,
) -> None:
    """Serve until SIGINT or SIGTERM; a batch in progress is finished before the process ends.
    With ``workers`` > 1 the app runs in that many child processes and this one supervises
    them and runs the worker (:func:`refuse_workers` says where that is refused).

    Raises:
        NotMigrated: the server database's schema is not at the head revision (SQLite was
            migrated on the way in).
        BackendUnavailable: the database cannot be reached.
        ConfigError: the port cannot be listened on, or ``workers`` > 1 where it cannot be.
        ApiProcessLost: an API process ended on its own (the others are stopped first).
    """
    refuse_workers(settings, workers)
    options = _Options(f"http://{host}:{port}", worker, workers, dev_users, verbose, console)
    simulator: SimulatorConfig | None = None
    if wants_simulator(settings):
        settings, simulator = with_simulator(settings, options.base_url)
    async with bootstrap.running(settings) as deps:
        await migrate.require_head(deps.db)
        # The port is bound here, before any API process starts, so a port in use fails once
        # with one message. Each API process gets a socket of its own on the port
        # (SO_REUSEPORT), and the kernel spreads new connections over them. One socket shared
        # by all would leave the spreading to whichever process accepts first, and uvloop
        # accepts every waiting connection at once: 32 connections opened together went 31 to
        # one process and 1 to the other, on this machine.
        sockets = listen(host, port, workers)
        try:
            stop = _stop_on_signals()
            if workers == 1:
                await _serve_here(deps, settings, sockets[0], stop, options, simulator)
            else:
                await _serve_many(deps, settings, sockets, stop, options)
        finally:
            for sock in sockets:
                sock.close()


def _stop_on_signals() -> asyncio.Event:
    """An event set by the first SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _app(deps: Deps, settings: Settings) -> Any:
    return create_app(
        deps,
        session_secret=settings.session_secret,
        session_ttl=settings.session_ttl,
        secure_cookies=settings.public_url.startswith("https://"),
    )


def _uvicorn(app: Any) -> _Server:
    """uvicorn over the running loop (``loop="none"``: it creates none), parsing with
    httptools."""
    return _Server(
        uvicorn.Config(app, http=HTTP, loop="none", backlog=BACKLOG, log_level="warning")
    )


def _implementation(server: _Server) -> str:
    """The event loop and HTTP parser this process really runs: ``uvloop, httptools``."""
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    protocol = server.config.http_protocol_class.__module__.rsplit(".", 1)[-1]
    return f"{loop}, {protocol.removesuffix('_impl')}"


class _Background:
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
            self.tasks += events.start(deps, bootstrap.build_event_webhook(settings), self.halt)

    async def stop(self) -> None:
        """Stop every task; the batch in progress is finished first."""
        self.halt.set()
        self.deps.trigger.wake()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _serve_here(
    deps: Deps,
    settings: Settings,
    sock: socket.socket,
    stop: asyncio.Event,
    options: _Options,
    simulator: SimulatorConfig | None,
) -> None:
    """One process: the app and the worker on this loop."""
    app = _app(deps, settings)
    async with _simulator_mounted(app, simulator):
        server = _uvicorn(app)
        server.config.load()
        background = _Background(deps, settings, on=options.worker)
        try:
            options.console.print(
                f"dueflow serving on {options.base_url} (worker "
                f"{'on' if options.worker else 'off'}, {_implementation(server)})",
                soft_wrap=True,
            )
            if simulator is not None:
                options.console.print(
                    f"payment simulator at {options.base_url}/sim "
                    f"(keys: {options.base_url}/sim/control/keys)",
                    soft_wrap=True,
                )
            if options.dev_users:
                await _print_dev_users(deps, options.base_url, options.console)
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            server.stop()
            await serving
        finally:
            await background.stop()
            options.console.print("dueflow stopped")


@dataclasses.dataclass
class _ApiProcess:
    """A child serving the app, and what the parent learns of it."""

    process: BaseProcess
    conn: Connection
    ready: asyncio.Future[str]
    exited: asyncio.Future[int]

    @property
    def pid(self) -> int:
        return self.process.pid or 0


async def _serve_many(
    deps: Deps,
    settings: Settings,
    sockets: list[socket.socket],
    stop: asyncio.Event,
    options: _Options,
) -> None:
    """An API process on each of ``sockets``, the worker here. A child that ends on its
    own stops the server (exit 1) rather than being restarted: a child that fails at start would
    fail again, and the process manager (systemd, Kubernetes) that restarts the whole server
    sees it."""
    values = settings.model_dump()
    # Admin page sessions are signed cookies: every process must sign with the same secret.
    values["session_secret"] = settings.session_secret or secrets.token_hex(32)
    children: list[_ApiProcess] = []
    stopping = asyncio.create_task(stop.wait())
    background: _Background | None = None
    lost: str | None = None
    try:
        children = [_start_child(sock, values, options.verbose) for sock in sockets]
        lost = await _all_ready(children, stopping)
        if lost is None and not stop.is_set():
            background = _Background(deps, settings, on=options.worker)
            pids = ", ".join(str(c.pid) for c in children)
            options.console.print(
                f"dueflow serving on {options.base_url} ({options.workers} API processes, pids "
                f"{pids}; worker {'on' if options.worker else 'off'} in pid {os.getpid()}; "
                f"{children[0].ready.result()})",
                soft_wrap=True,
            )
            if options.dev_users:
                await _print_dev_users(deps, options.base_url, options.console)
            watched: list[asyncio.Future[Any]] = [stopping, *(c.exited for c in children)]
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            lost = _first_lost(children)
        if lost is not None:
            options.console.print(f"[red]{lost}[/red]; stopping the others", soft_wrap=True)
    finally:
        stopping.cancel()
        await _stop_children(children)
        if background is not None:
            await background.stop()
        options.console.print("dueflow stopped")
    if lost is not None:
        raise ApiProcessLost(lost)


def _start_child(sock: socket.socket, values: dict[str, Any], verbose: bool) -> _ApiProcess:
    """Spawn one API process (a fresh interpreter: no event loop, pool or thread of this one is
    inherited) with the listening socket and a pipe to this process."""
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    process = context.Process(
        target=_api_process, args=(sock, values, there, verbose), name="dueflow-api"
    )
    process.start()
    there.close()
    loop = asyncio.get_running_loop()
    child = _ApiProcess(process, here, loop.create_future(), loop.create_future())

    def on_message() -> None:
        loop.remove_reader(here.fileno())
        try:
            message = here.recv()
        except (EOFError, OSError):
            return  # it ended before it served: on_exit tells
        if not child.ready.done():
            child.ready.set_result(str(message))

    def on_exit() -> None:
        loop.remove_reader(process.sentinel)
        process.join()
        code = process.exitcode
        child.exited.set_result(-1 if code is None else code)

    loop.add_reader(here.fileno(), on_message)
    loop.add_reader(process.sentinel, on_exit)
    return child


async def _all_ready(children: list[_ApiProcess], stopping: asyncio.Task[Any]) -> str | None:
    """Wait until every child serves; what went wrong when one ended first."""
    waiting: set[asyncio.Future[Any]] = {c.ready for c in children}
    while waiting:
        exits = [c.exited for c in children]
        _, waiting = await asyncio.wait(
            [stopping, *waiting, *exits], return_when=asyncio.FIRST_COMPLETED
        )
        lost = _first_lost(children)
        if lost is not None or stopping.done():
            return lost
        waiting -= {stopping, *exits}
    return None


def _first_lost(children: list[_ApiProcess]) -> str | None:
    for child in children:
        if child.exited.done():
            code = child.exited.result()
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            return f"API process {child.pid} {how}"
    return None


async def _stop_children(children: list[_ApiProcess]) -> None:
    """SIGTERM to every child still running; each finishes its requests in progress. One still
    running after STOP_GRACE seconds is killed."""
    running = [c for c in children if not c.exited.done()]
    for child in running:
        with contextlib.suppress(ProcessLookupError):
            child.process.terminate()
    if running:
        _, late = await asyncio.wait([c.exited for c in running], timeout=STOP_GRACE)
        for child in running:
            if child.exited in late:
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()
        if late:
            await asyncio.wait(late)
    loop = asyncio.get_running_loop()
    for child in children:
        loop.remove_reader(child.conn.fileno())
        child.conn.close()


def _api_process(
    sock: socket.socket, values: dict[str, Any], parent: Connection, verbose: bool
) -> None:
    """An API process: the app on ``sock`` until SIGTERM or until the parent is gone."""
    from dueflow import logs

    # Ctrl-C in a terminal signals the whole process group; the parent decides for all.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    settings = load_settings(**values)
    logs.configure(verbose=verbose, json_lines=settings.log_format == "json")
    try:
        uvloop.run(_serve_api(settings, sock, parent))
    except DueflowError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc.message}", soft_wrap=True)
        sys.exit(1)


async def _serve_api(settings: Settings, sock: socket.socket, parent: Connection) -> None:
    async with bootstrap.running(settings) as deps:
        server = _uvicorn(_app(deps, settings))
        server.config.load()
        server.on_started = lambda: parent.send(_implementation(server))
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, server.stop)

        # The parent never writes: the pipe becomes readable at its end (EOF), so a parent that
        # was killed does not leave this process serving on.
        def parent_gone() -> None:
            loop.remove_reader(parent.fileno())
            server.stop()

        loop.add_reader(parent.fileno(), parent_gone)
        await server.serve(sockets=[sock])


class _Server(uvicorn.Server):
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
