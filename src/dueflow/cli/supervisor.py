"""``dueflow serve``'s top: :func:`serve` runs the app and the worker in this process
(:func:`dueflow.cli.server.serve_here`) or, with ``--workers N`` (PostgreSQL and MySQL), the app
in N API processes sharing one port and the worker once, here, in the parent that starts,
watches and stops them."""

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
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import uvloop
from rich.console import Console
from sqlalchemy.engine import make_url

from dueflow import bootstrap
from dueflow.cli import server
from dueflow.config import Settings, load_settings
from dueflow.exceptions import ConfigError, DueflowError
from dueflow.payments.simulator import SimulatorConfig
from dueflow.service.deps import Deps
from dueflow.store import migrate
from dueflow.store.db import async_url

#: Seconds the parent waits for an API process to finish its requests after SIGTERM; then
#: SIGKILL.
STOP_GRACE = 30.0


class ApiProcessLost(DueflowError):
    """An API process ended while the server ran; the others were stopped."""


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
    if server.wants_simulator(settings):
        raise ConfigError(
            f"--workers {workers} cannot serve the payment simulator: it keeps its trades in "
            "one process's memory. Run `dueflow simulator` on its own and configure the "
            "provider settings from its /control/keys, use the prod profile, or serve one "
            "process."
        )


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
    options = server.Options(f"http://{host}:{port}", worker, workers, dev_users, verbose, console)
    simulator: SimulatorConfig | None = None
    if server.wants_simulator(settings):
        settings, simulator = server.with_simulator(settings, options.base_url)
    async with bootstrap.running(settings) as deps:
        await migrate.require_head(deps.db)
        # The port is bound here, before any API process starts, so a port in use fails once
        # with one message. Each API process gets a socket of its own on the port
        # (SO_REUSEPORT), and the kernel spreads new connections over them. One socket shared
        # by all would leave the spreading to whichever process accepts first, and uvloop
        # accepts every waiting connection at once: 32 connections opened together went 31 to
        # one process and 1 to the other, on this machine.
        sockets = server.listen(host, port, workers)
        try:
            stop = server.stop_on_signals()
            if workers == 1:
                await server.serve_here(deps, settings, sockets[0], stop, options, simulator)
            else:
                await _serve_many(deps, settings, sockets, stop, options)
        finally:
            for sock in sockets:
                sock.close()


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
    options: server.Options,
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
    background: server.Background | None = None
    lost: str | None = None
    try:
        children = [_start_child(sock, values, options.verbose) for sock in sockets]
        lost = await _all_ready(children, stopping)
        if lost is None and not stop.is_set():
            background = server.Background(deps, settings, on=options.worker)
            pids = ", ".join(str(c.pid) for c in children)
            options.console.print(
                f"dueflow serving on {options.base_url} ({options.workers} API processes, pids "
                f"{pids}; worker {'on' if options.worker else 'off'} in pid {os.getpid()}; "
                f"{children[0].ready.result()})",
                soft_wrap=True,
            )
            if options.dev_users:
                await server.print_dev_users(deps, options.base_url, options.console)
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
    logs.configure(
        verbose=verbose,
        json_lines=settings.log_format == "json",
        access_log=settings.access_log,
    )
    try:
        uvloop.run(_serve_api(settings, sock, parent))
    except DueflowError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc.message}", soft_wrap=True)
        sys.exit(1)


async def _serve_api(settings: Settings, sock: socket.socket, parent: Connection) -> None:
    async with bootstrap.running(settings) as deps:
        api = server.uvicorn_server(server.api_app(deps, settings))
        api.config.load()
        api.on_started = lambda: parent.send(server.implementation(api))
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, api.stop)

        # The parent never writes: the pipe becomes readable at its end (EOF), so a parent that
        # was killed does not leave this process serving on.
        def parent_gone() -> None:
            loop.remove_reader(parent.fileno())
            api.stop()

        loop.add_reader(parent.fileno(), parent_gone)
        await api.serve(sockets=[sock])
