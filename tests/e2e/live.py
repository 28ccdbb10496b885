"""A real ``dueflow serve`` in a subprocess for end-to-end tests: a free port, a fresh SQLite
file, the environment cleared of other DUEFLOW_ settings, ready when /healthz answers."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import eventually_sync

DUEFLOW = Path(sys.executable).parent / "dueflow"
TOKEN_LINE = re.compile(r"(admin|user)\s+(\w+)\s+\(id (\d+)\)\s+token (\S+)")


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answers(url: str) -> bool:
    """The server at ``url`` is up and says 200."""
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Served:
    """A running server: its URL, database file, process, log, and the --dev-users tokens."""

    base: str
    db: Path
    proc: subprocess.Popen[bytes]
    log: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def output(self) -> str:
        """What the server printed so far."""
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM and wait; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@contextlib.contextmanager
def serve(
    tmp_path: Path, env: Mapping[str, str] | None = None, *, dev_users: bool = True
) -> Iterator[Served]:
    """Start ``dueflow serve`` (dev profile unless ``env`` says otherwise) and stop it after."""
    port = free_port()
    db = tmp_path / "serve.db"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    clean.update({"DUEFLOW_DATABASE_URL": f"sqlite:///{db}", "DUEFLOW_PROFILE": "dev"})
    clean.update(env or {})
    log_path = tmp_path / "serve.log"
    args = [str(DUEFLOW), "serve", "--port", str(port)] + (["--dev-users"] if dev_users else [])
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, env=clean, stdout=log, stderr=log)
        served = Served(f"http://127.0.0.1:{port}", db, proc, log_path)
        try:
            if not eventually_sync(lambda: answers(f"{served.base}/healthz"), 30, 0.1):
                pytest.fail(f"the server did not start:\n{served.output()}")
            if dev_users:
                if not eventually_sync(lambda: "bob" in served.output(), 10, 0.05):
                    pytest.fail(f"no tokens printed:\n{served.output()}")
                served.tokens = {m[1]: m[3] for m in TOKEN_LINE.findall(served.output())}
            yield served
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
