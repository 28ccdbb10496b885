"""``dueflow serve --workers N`` (issue 12, item 3): N API processes share the port and the worker
runs once, in the parent. Goods raced through both processes at once are placed once; SIGTERM
stops every process and exits 0; a child that dies stops the server with exit 1; SQLite and the
in-memory payment simulator are refused with why."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dueflow import bootstrap
from dueflow.config import load_settings
from dueflow.service import accounts
from dueflow.store import schema
from tests.conftest import SERVICE_URLS, _reset_server_database, eventually_sync, require_service
from tests.e2e.live import DUEFLOW, TOKEN_LINE, free_port

pytestmark = pytest.mark.slow

SERVING = re.compile(r"serving on \S+ \((\d+) API processes, pids ([\d, ]+); worker (on|off)")
GOODS = 20
RACERS = 4  # clients per goods item, half on each API process


def _env(database_url: str, profile: str = "prod") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env.update({"DUEFLOW_DATABASE_URL": database_url, "DUEFLOW_PROFILE": profile})
    return env


@dataclass
class Many:
    """A running ``dueflow serve --workers 2``: its port, process, log and API process ids."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    pids: list[int]

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _children(pid: int) -> list[int]:
    """Every direct child of ``pid`` (the API processes and multiprocessing's helper)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


def _left(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not gone, not a zombie)."""
    left = []
    for pid in pids:
        with contextlib.suppress(FileNotFoundError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                left.append(pid)
    return left


def _none_left(pids: list[int]) -> bool:
    """True once none of ``pids`` runs (multiprocessing's resource tracker ends on its own once
    its parent is gone, a moment later)."""
    return eventually_sync(lambda: not _left(pids), 30, 0.05)


@contextlib.contextmanager
def serve_many(
    tmp_path: Path, database_url: str, *extra: str, dev_users: bool = True
) -> Iterator[Many]:
    """Start ``dueflow serve --workers 2`` and wait until it says it serves."""
    port = free_port()
    log_path = tmp_path / "serve.log"
    args = [str(DUEFLOW), "serve", "--port", str(port), "--workers", "2", *extra]
    args += ["--dev-users"] if dev_users else []
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, env=_env(database_url), stdout=log, stderr=log)
        try:
            many = Many(port, proc, log_path, [])
            if not eventually_sync(lambda: SERVING.search(many.output()) is not None, 60, 0.1):
                pytest.fail(f"the server did not start:\n{many.output()}")
            match = SERVING.search(many.output())
            assert match is not None
            many.pids = [int(p) for p in match[2].split(", ")]
            yield many
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)


SERVER_URLS = [
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


@pytest.fixture(params=SERVER_URLS)
async def server_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """The test database of PostgreSQL or MariaDB, migrated and empty."""
    name = request.param
    require_service(name, "127.0.0.1", 5432 if name == "postgres" else 3306)
    url = SERVICE_URLS[name]
    assert url is not None
    async with bootstrap.running(load_settings(database_url=url, profile="prod")) as deps:
        await _reset_server_database(deps.db)
    yield url


def _owners(port: int, pids: list[int]) -> dict[int, int]:
    """Which process holds the server side of each connection to ``port``: client port -> pid
    (read from /proc: the sockets each process has open, and the kernel's TCP table)."""
    inode_pid: dict[int, int] = {}
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inode_pid[int(target[8:-1])] = pid
    owners = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
            if state == "01" and int(local.rsplit(":", 1)[1], 16) == port and inode in inode_pid:
                owners[int(remote.rsplit(":", 1)[1], 16)] = inode_pid[inode]
    return owners


def _connections_on_each(many: Many, per_process: int) -> list[http.client.HTTPConnection]:
    """``per_process`` open keep-alive connections served by each API process, found by opening
    connections until each process holds enough (the kernel hands each to whichever accepts)."""
    kept: dict[int, list[http.client.HTTPConnection]] = {pid: [] for pid in many.pids}
    spare = []
    for _ in range(200):
        if all(len(c) >= per_process for c in kept.values()):
            break
        conn = http.client.HTTPConnection("127.0.0.1", many.port, timeout=30)
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        assert response.status == 200
        response.read()
        client_port = conn.sock.getsockname()[1]
        owner = _owners(many.port, many.pids).get(client_port)
        assert owner is not None, "a connection answered by no API process"
        (kept[owner] if len(kept[owner]) < per_process else spare).append(conn)
    for conn in spare:
        conn.close()
    assert all(len(c) >= per_process for c in kept.values()), {p: len(c) for p, c in kept.items()}
    return [conn for conns in kept.values() for conn in conns]


def _place(conn: http.client.HTTPConnection, token: str, goods_id: int) -> int:
    try:
        conn.request(
            "POST",
            "/api/orders",
            body=json.dumps({"goods_id": goods_id}),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        response.read()
    except OSError:
        return 0  # the server closed the connection: the assertion on statuses shows it
    return response.status


async def test_goods_raced_through_two_api_processes_is_placed_once(tmp_path, server_url):
    settings = load_settings(database_url=server_url, profile="prod")
    async with bootstrap.running(settings) as deps:
        seller, _ = await accounts.add_user(deps, "seller")
        tokens = [(await accounts.add_user(deps, f"buyer{i}"))[1] for i in range(RACERS)]
        goods = [
            await accounts.add_goods(deps, seller_id=seller.id, title=f"kite {i}", price="9.90")
            for i in range(GOODS)
        ]
        with serve_many(tmp_path, server_url, dev_users=False) as many:
            assert len(set(many.pids)) == 2
            conns = _connections_on_each(many, RACERS // 2)
            start = threading.Barrier(RACERS)

            def racer(i: int) -> list[int]:
                statuses = []
                for goods_id in goods:
                    start.wait(timeout=60)  # every racer sends its request for it at once
                    statuses.append(_place(conns[i], tokens[i], goods_id))
                return statuses

            with ThreadPoolExecutor(RACERS) as pool:
                results = list(pool.map(racer, range(RACERS)))
            for conn in conns:
                conn.close()
            assert many.proc.poll() is None, many.output()
            for k in range(GOODS):
                statuses = sorted(r[k] for r in results)
                assert statuses == [201] + [409] * (RACERS - 1), (k, statuses, many.output())
        async with deps.db.engine.connect() as conn:
            per_goods = dict(
                (
                    await conn.execute(
                        select(schema.orders.c.goods_id, func.count()).group_by(
                            schema.orders.c.goods_id
                        )
                    )
                ).all()
            )
            held = (
                await conn.execute(
                    select(func.count())
                    .select_from(schema.goods)
                    .where(schema.goods.c.reserved_order_id.is_not(None))
                )
            ).scalar_one()
    assert per_goods == {g: 1 for g in goods}
    assert held == GOODS


@pytest.mark.postgres
def test_sigterm_stops_every_process_and_exits_0(tmp_path):
    require_service("postgres", "127.0.0.1", 5432)
    url = SERVICE_URLS["postgres"]
    assert url is not None
    subprocess.run([str(DUEFLOW), "migrate"], env=_env(url), check=True, capture_output=True)
    with serve_many(tmp_path, url) as many:
        children = _children(many.proc.pid)
        assert set(many.pids) <= set(children)
        assert "worker on in pid" in many.output()
        # The --dev-users tokens are printed once, by the parent, not once per API process.
        assert eventually_sync(lambda: "try: curl" in many.output(), 30, 0.05)
        assert len(TOKEN_LINE.findall(many.output())) == 3
        many.proc.send_signal(signal.SIGTERM)
        assert many.proc.wait(timeout=60) == 0
        assert "dueflow stopped" in many.output()
        assert _none_left(children), (many.pids, _left(children))


@pytest.mark.postgres
def test_an_api_process_that_dies_stops_the_server_with_exit_1(tmp_path):
    require_service("postgres", "127.0.0.1", 5432)
    url = SERVICE_URLS["postgres"]
    assert url is not None
    subprocess.run([str(DUEFLOW), "migrate"], env=_env(url), check=True, capture_output=True)
    with serve_many(tmp_path, url, "--no-worker", dev_users=False) as many:
        assert "worker off" in many.output()
        children = _children(many.proc.pid)
        os.kill(many.pids[0], signal.SIGKILL)
        assert many.proc.wait(timeout=60) == 1
        out = many.output()
        assert f"API process {many.pids[0]} was killed by signal 9; stopping the others" in out
        assert "Traceback" not in out
        assert _none_left(children), (many.pids, _left(children))


@pytest.mark.postgres
def test_api_processes_do_not_outlive_a_killed_parent(tmp_path):
    require_service("postgres", "127.0.0.1", 5432)
    url = SERVICE_URLS["postgres"]
    assert url is not None
    subprocess.run([str(DUEFLOW), "migrate"], env=_env(url), check=True, capture_output=True)
    with serve_many(tmp_path, url, "--no-worker", dev_users=False) as many:
        children = _children(many.proc.pid)
        many.proc.kill()
        many.proc.wait(timeout=60)
        assert _none_left(children), (many.pids, _left(children))


def _refused(database_url: str, profile: str = "prod") -> subprocess.CompletedProcess[str]:
    args = [str(DUEFLOW), "serve", "--port", str(free_port()), "--workers", "2"]
    return subprocess.run(
        args, env=_env(database_url, profile), capture_output=True, text=True, timeout=60
    )


def test_sqlite_refuses_more_than_one_api_process_and_says_why(tmp_path):
    done = _refused(f"sqlite:///{tmp_path / 'one.db'}")
    assert done.returncode == 2, done.stderr
    message = " ".join(done.stderr.split())
    assert "--workers 2 needs PostgreSQL or MySQL: SQLite has one writer at a time" in message
    assert "busy handler" in message
    assert "serving on" not in message
    assert not (tmp_path / "one.db").exists()  # refused before anything was opened


@pytest.mark.postgres
def test_the_in_memory_simulator_is_refused_with_more_than_one_api_process():
    require_service("postgres", "127.0.0.1", 5432)
    url = SERVICE_URLS["postgres"]
    assert url is not None
    done = _refused(url, profile="dev")
    assert done.returncode == 2, done.stderr
    message = " ".join(done.stderr.split())
    assert "cannot serve the payment simulator: it keeps its trades in one process's memory" in (
        message
    )
    assert "serving on" not in message


def test_a_port_in_use_is_refused_with_exit_2(tmp_path):
    with contextlib.closing(socket.create_server(("127.0.0.1", 0))) as taken:
        port = taken.getsockname()[1]
        env = _env(f"sqlite:///{tmp_path / 'one.db'}", "dev")
        done = subprocess.run(
            [str(DUEFLOW), "serve", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
