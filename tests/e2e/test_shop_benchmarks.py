"""The shop benchmarks stay honest: the herd's bulk seed writes exactly what a real placement
writes, and both scripts run end to end at a tiny size with every check of theirs passing (the
herd on SQLite and PostgreSQL, the flash sale over HTTP with wrk). No timing is asserted."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dueflow import bootstrap
from dueflow.config import load_settings
from dueflow.service import accounts, shop
from tests.conftest import SERVICE_URLS, in_ci, require_service

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import _seed  # noqa: E402
import herd_shop  # noqa: E402

pytestmark = pytest.mark.serial

#: Tables a placement may touch that the seed writes on purpose differently or not at all.
NOT_COMPARED = {"alembic_version", "event_sequence"}


async def place_for_real(path: Path) -> None:
    """The world the seed assumes for one order (seller 1, buyer 2, SKUs 1 and 2, coupon 1),
    and that order placed through the service layer."""
    settings = load_settings(database_url=f"sqlite:///{path}", profile="prod")
    bought = herd_shop.lines_of(1, 2)
    async with bootstrap.running(settings) as deps:
        seller, _ = await accounts.add_user(deps, "seller")
        buyer, _ = await accounts.add_user(deps, "buyer2")
        assert (seller.id, buyer.id) == (1, 2)
        for sku_id, units in bought:
            await shop.create_sku(
                deps,
                seller_id=seller.id,
                title=f"sku {sku_id}",
                price=herd_shop.price_of(sku_id),
                stock=herd_shop.SPARE + units,
            )
        now = datetime.now(UTC)
        template = await shop.create_template(
            deps,
            seller_id=seller.id,
            title=herd_shop.COUPON_TITLE,
            amount_off=herd_shop.OFF,
            min_amount=herd_shop.MINIMUM,
            valid_from=now - timedelta(days=1),
            valid_until=now + timedelta(days=30),
            total=1,
        )
        coupon = await shop.issue_coupon(
            deps, template_id=template["id"], issuer_id=seller.id, user_id=buyer.id
        )
        await shop.place_shop_order(
            deps,
            buyer_id=buyer.id,
            lines=[{"sku_id": s, "quantity": q} for s, q in bought],
            coupon_id=coupon["id"],
        )


def test_the_herd_seed_writes_what_a_placement_writes(tmp_path: Path) -> None:
    real = tmp_path / "real.db"
    import asyncio

    asyncio.run(place_for_real(real))
    now = datetime.now(UTC)
    tables = herd_shop.shop_rows(1, skus=2, buyers=1, now=now, due=now + timedelta(minutes=15))
    conn = sqlite3.connect(real)
    try:
        every = {
            name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        for name in every - NOT_COMPARED - set(tables):
            assert conn.execute(f"SELECT count(*) FROM {name}").fetchone() == (0,), name
        for name, (columns, rows) in tables.items():
            found = conn.execute(f"SELECT {', '.join(columns)} FROM {name} ORDER BY id").fetchall()
            assert len(found) == len(rows), name
            for seeded, placed in zip(rows, found, strict=True):
                for column, want, got in zip(columns, seeded, placed, strict=True):
                    if isinstance(want, datetime) or column in ("name", "token_hash"):
                        continue  # times differ, and users are named for the bench
                    if name == "order_events" and column == "seq":
                        # The seed's events are numbered already: the sequencer did it.
                        assert (want, got) == (1, None)
                        continue
                    assert _seed.sqlite_value(want) == got, (name, column)
    finally:
        conn.close()


def _run(script: str, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    "database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_tiny_shop_herd_gives_everything_back(database: str) -> None:
    args = ["--orders", "300", "--skus", "4", "--buyers", "10", "--lead", "1"]
    if database == "postgres":
        require_service("postgres", "127.0.0.1", 5432)
        args += ["--database-url", str(SERVICE_URLS["postgres"])]
    result = _run("herd_shop.py", *args)
    assert result["ok"], result["failed"]
    found = result["db"]
    assert isinstance(found, dict)
    assert found["coupons available and free"] == found["released events"] == 300


@pytest.mark.slow
def test_a_tiny_flash_sale_over_http_balances() -> None:
    if shutil.which("wrk") is None:
        if in_ci():  # .ci/run installs it
            pytest.fail("wrk is not installed (apt-get install wrk)")
        pytest.skip("wrk is not installed (apt-get install wrk)")
    result = _run(
        "http_flash.py",
        *("--units", "20", "--sku-stock", "30", "--buyers", "60", "--limit", "1"),
        *("--attempts", "200", "--connections", "8", "--threads", "2"),
    )
    assert result["ok"], result["failed"]
    assert result["sent"] == result["answered"] == 200
    assert result["placed"] == 20
    assert result["sold_out"] is True
