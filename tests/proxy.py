"""A TCP proxy on 127.0.0.1 in front of a real server (Redis, PostgreSQL, MariaDB), which a test
cuts, brings back on the same port, or turns silent: the shared servers themselves are never
stopped. ``python -m tests.proxy`` runs one as a process of its own, cut and brought back by
signals."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable


class Proxy:
    """A TCP proxy to ``host:port`` that the test can cut and bring back."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._sockets: set[asyncio.StreamWriter] = set()
        self._pipes: set[asyncio.Task[None]] = set()
        #: Break the connection instead of passing on the server's next reply (the command was
        #: applied, its answer lost).
        self.lose_next_reply = False
        #: Accept new connections but never answer them (a server that hangs, a black hole).
        self.silent = False

    @property
    def listening(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Listen (again, on the same port once it has one)."""
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        """Stop listening and break every open connection (a reset, as a dead server gives)."""
        assert self._server is not None
        self._server.close()
        self._break_all()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        self._sockets.clear()
        self._server = None

    async def hang(self) -> None:
        """Break every open connection and answer none of those that come next."""
        self.silent = True
        self._break_all()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    def _break_all(self) -> None:
        for writer in self._sockets:
            writer.transport.abort()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.silent:
            self._sockets.add(writer)
            return  # kept open, never read nor answered, until the test breaks it
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._sockets |= {writer, up_writer}
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer, replies=True)),
        ]
        self._pipes.update(pipes)
        await asyncio.gather(*pipes, return_exceptions=True)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, replies: bool = False
    ) -> None:
        try:
            while data := await reader.read(65536):
                if replies and self.lose_next_reply:
                    self.lose_next_reply = False
                    break
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.transport.abort()


async def serve(port: int, upstream: tuple[str, int]) -> None:
    """Run a proxy on ``port`` to ``upstream`` until SIGTERM: SIGUSR1 cuts it (as a server that
    went down), SIGUSR2 brings it back on the same port (as the server up again)."""
    proxy = Proxy(*upstream)
    proxy.port = port
    await proxy.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    pending: set[asyncio.Task[None]] = set()

    async def down() -> None:
        if proxy.listening:
            await proxy.cut()

    async def up() -> None:
        if not proxy.listening:
            await proxy.start()

    def later(step: Callable[[], Awaitable[None]]) -> None:
        task = asyncio.ensure_future(step())
        pending.add(task)
        task.add_done_callback(pending.discard)

    loop.add_signal_handler(signal.SIGUSR1, later, down)
    loop.add_signal_handler(signal.SIGUSR2, later, up)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(f"proxy on 127.0.0.1:{port} to {upstream[0]}:{upstream[1]}", flush=True)
    await stop.wait()


def main() -> None:
    """``python -m tests.proxy PORT HOST:PORT``: a proxy of its own process (the chaos soak's
    PostgreSQL restarts)."""
    port, upstream = sys.argv[1], sys.argv[2]
    host, _, upstream_port = upstream.rpartition(":")
    asyncio.run(serve(int(port), (host, int(upstream_port))))


if __name__ == "__main__":
    main()
