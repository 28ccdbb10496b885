"""A real ``dueflow worker --metrics-port 0``: it prints the port it took and serves /metrics
there, with the worker's own metrics (handler time, batch sizes, trigger errors, the scanner)
and the gauges read from the database; a port already taken exits 2 naming it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
from datetime import timedelta
from pathlib import Path

import httpx

from dueflow import bootstrap
from dueflow.clock import FakeClock, utcnow
from dueflow.config import Settings
from dueflow.service import accounts, orders
from tests.conftest import eventually_sync
from tests.e2e.live import DUEFLOW

PORT_LINE = re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")
NEW_FAMILIES = (
    "dueflow_timer_handler_duration_seconds",
    "dueflow_timer_batch_size",
    "dueflow_trigger_errors_total",
    "dueflow_scanner_passes_total",
    "dueflow_scanner_claimed_total",
    "dueflow_scanner_errors_total",
)


def place_expired_order(settings: Settings) -> int:
    """One unpaid order placed two hours ago: its cancel and reminder are long due."""

    async def go() -> int:
        clock = FakeClock(utcnow() - timedelta(hours=2))
        async with bootstrap.running(settings, clock=clock, migrate_sqlite=False) as deps:
            seller, _ = await accounts.add_user(deps, "seller")
            buyer, _ = await accounts.add_user(deps, "buyer")
            goods_id = await accounts.add_goods(deps, seller_id=seller.id, title="kite", price="9")
            return await orders.place_order(deps, buyer_id=buyer.id, goods_id=goods_id)

    return asyncio.run(go())


def worker(db_path: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env.update(DUEFLOW_DATABASE_URL=f"sqlite:///{db_path}", DUEFLOW_PROFILE="prod")
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(DUEFLOW), "worker", *extra], env=env, stdout=out, stderr=subprocess.STDOUT
        )


def scrape(url: str) -> str:
    try:
        answer = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return ""
    return answer.text if answer.status_code == 200 else ""


def test_worker_serves_its_metrics_on_the_port_it_prints(
    settings: Settings, db_path: Path, tmp_path: Path
) -> None:
    place_expired_order(settings)
    log = tmp_path / "worker.log"
    proc = worker(db_path, log, "--metrics-port", "0")
    try:
        assert eventually_sync(lambda: PORT_LINE.search(log.read_text()), 30, 0.05), log.read_text()
        printed = PORT_LINE.search(log.read_text())
        assert printed is not None
        url = f"http://127.0.0.1:{printed[1]}/metrics"
        done = 'dueflow_orders{status="cancelled_unpaid"} 1.0'
        told = 'dueflow_timers_fired_total{kind="order_closed",result="ran"} 1.0'

        def cancelled_and_told() -> bool:
            text = scrape(url)
            return done in text and told in text

        assert eventually_sync(cancelled_and_told, 30, 0.1), log.read_text()
        text = scrape(url)
        for family in NEW_FAMILIES:
            assert f"# TYPE {family} " in text, family
        for operation in ("arm", "wait", "ack", "feed"):  # at 0 from the start
            errors = f'dueflow_trigger_errors_total{{operation="{operation}",trigger="db"}}'
            assert f"{errors} 0.0" in text
        # Whoever claimed them (claim loop or scanner), each kind's handler ran once: the
        # cancel, the reminder, and the notice the cancel wrote.
        for kind in ("cancel_unpaid", "pay_reminder", "order_closed"):
            assert f'dueflow_timer_handler_duration_seconds_count{{kind="{kind}"}} 1.0' in text
            assert f'dueflow_timers_fired_total{{kind="{kind}",result="ran"}} 1.0' in text
        assert "dueflow_timer_batch_size_sum 3.0" in text
        assert "dueflow_scanner_passes_total 1.0" in text
        assert "dueflow_timers_overdue 0.0" in text
        assert httpx.get(url.removesuffix("metrics") + "other", timeout=2).status_code == 404
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    assert scrape(url) == ""  # the endpoint stopped with the worker


def test_a_metrics_port_in_use_exits_2_naming_it(db_path: Path, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        log = tmp_path / "worker.log"
        proc = worker(db_path, log, "--metrics-port", str(port))
        assert proc.wait(timeout=30) == 2
    output = " ".join(log.read_text().split())
    assert f"cannot serve metrics on 127.0.0.1:{port}" in output
    assert "Traceback" not in output
