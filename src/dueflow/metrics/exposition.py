"""/metrics on a socket of its own, for a process without an API (``dueflow worker
--metrics-port``): the process's own registry (handler time, batch sizes, trigger errors, the
scanner's finds, lateness) and the gauges read from the database, exactly as ``dueflow serve``
exposes them. The caller says how the gauges are read (the use case), so this adapter imports
none."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator

import uvicorn
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST

from dueflow.exceptions import ConfigError, DueflowError
from dueflow.metrics.prometheus import Metrics

log = logging.getLogger(__name__)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket for /metrics; port 0 takes any free port (read it back with
    ``getsockname()``).

    Raises:
        ConfigError: the address cannot be listened on (in use, not this machine's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # "::", "::1" are IPv6
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None


def metrics_app(process_metrics: Metrics, refresh: Callable[[], Awaitable[None]]) -> FastAPI:
    """An app answering GET /metrics in the Prometheus text format, each scrape after
    ``refresh`` (which sets the gauges read from the database)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/metrics")
    async def metrics() -> Response:
        try:
            await refresh()
        except DueflowError as exc:
            # The process's own counters still tell what is wrong (trigger and scanner errors);
            # the database gauges keep the values of the last scrape that could read them.
            log.warning("metrics: database gauges not refreshed (%s)", exc.message)
        return Response(process_metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


async def serve_metrics(app: FastAPI, sock: socket.socket, stop: asyncio.Event) -> None:
    """Serve ``app`` (:func:`metrics_app`) on ``sock`` until ``stop`` is set."""
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    server = _Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    stopping.cancel()
    await serving


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the worker's handlers stop it with the rest."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
